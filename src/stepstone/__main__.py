"""``python -m stepstone``: the same as the ``stepstone`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
