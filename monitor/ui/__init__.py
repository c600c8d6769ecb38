"""The page: figures (charts.py, no streamlit), panels and controls (streamlit)."""
