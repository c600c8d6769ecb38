"""Reading the store into judgements: a window of a run becomes its Assessment (the one path,
window.py), and around it what a reader of runs needs: the recent window, a run's history
and outcomes, the ends of identical runs before it, two runs compared (the regression
gate), the stall line, and following a live run for its outputs (follow.py). It reads the
store and the frames' math below it; it never writes the store but through the requests of
its callers."""
