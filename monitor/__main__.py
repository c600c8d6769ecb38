"""python -m monitor ... (the same as the `starvation-monitor` console script)."""
import sys

from monitor.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
