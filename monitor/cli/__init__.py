"""The command line: `python -m monitor` / `starvation-monitor`. main.py dispatches and
prints, args.py holds the flags, compare.py the compare command."""
