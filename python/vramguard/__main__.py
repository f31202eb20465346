"""`python -m vramguard`: the command line, which is cli.py."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
