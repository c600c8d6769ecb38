"""The page: figures built from frames (no streamlit), and the panels, controls and fragments
that show them; what the page reads, and when it redraws."""
