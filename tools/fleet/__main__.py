"""``python -m fleet``: what ``scripts/fleet`` runs (see ``fleet.cli``)."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
