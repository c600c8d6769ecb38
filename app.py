"""The dashboard, for `streamlit run app.py` (`make run`). The page itself is
monitor/ui/app.py, inside the package, so that an installed Starvation Monitor serves the same
page (`starvation-monitor dashboard`)."""
import runpy

runpy.run_module("monitor.ui.app", run_name="__main__")
