"""``python -m chaos``: what ``scripts/chaos`` runs (see ``chaos.cli``)."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
