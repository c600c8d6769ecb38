"""What `starvation-monitor dashboard` gives `streamlit run`: a folder of its own (Streamlit
puts the script's folder first on sys.path, and monitor/ui's modules must not shadow other
packages' names), running the page monitor/ui/app.py."""
import runpy

runpy.run_module("monitor.ui.app", run_name="__main__")
