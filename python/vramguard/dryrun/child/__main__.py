"""`python -m vramguard.dryrun.child`: one run of a dry run (main.py)."""
import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())
