"""Pure reading of the store's frames: analysis.py (shares, busy series, spans), window.py
(a window of a run -> its Assessment, the one path), compare.py (two runs, the regression
gate), stall.py (the page's stall line)."""
