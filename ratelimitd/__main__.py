"""`python -m ratelimitd` and the `ratelimitd` console script."""

import sys

from .process.cli import main

if __name__ == "__main__":
    sys.exit(main())
