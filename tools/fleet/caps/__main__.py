"""``python -m fleet.caps``: run capability campaigns, or be one worker process."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
