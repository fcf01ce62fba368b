"""`python -m sidecars.usage serve|accounts|tokens ...` (see sidecars/usage/cli.py)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
