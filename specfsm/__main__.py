"""``python -m specfsm``: the same command line as the ``specfsm`` console script."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
