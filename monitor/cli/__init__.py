"""The command line (`python -m monitor`, `starvation-monitor`): flags parsed, the command
dispatched, its result printed; nothing here decides what is measured or advised."""
