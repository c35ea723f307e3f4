"""``Commands``: a group of subcommands that all take the store's options.

Every command parser is made the same way: the store's options (``--store``, ``--json``,
``-v``) as its parent, a help line and a description, and the handler ``main`` calls.
A command module is handed one ``Commands`` and says only what differs (name, handler,
its own options), so that setup is written once here.

A command's texts are its handler's docstring, as ``--help`` shows them: the first
paragraph is the help line of the command list, the rest the description. Texts are
given to ``add`` only for a command without a handler (``bench``) or whose handler's
docstring is for its callers (``runs show``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["Commands", "Handler"]

#: What carries out a parsed command: it returns the exit status.
Handler = Callable[[argparse.Namespace], int]


class Commands:
    """The subparsers ``actions`` of a command group, each parser with ``store`` as parent."""

    def __init__(self, actions: Any, store: argparse.ArgumentParser) -> None:
        self.actions = actions
        self.store = store

    def add(
        self,
        name: str,
        handler: Handler | None,
        help_text: str | None = None,
        description: str | None = None,
        **options: Any,
    ) -> argparse.ArgumentParser:
        """Add the command ``name`` (``options`` go to ``add_parser``); ``handler`` carries
        it out (None: ``main`` runs it itself, as ``bench``). Without ``help_text`` the
        texts are ``handler``'s docstring. Return its parser, for the caller's arguments."""
        if help_text is None:
            help_text, description = _texts(handler)
        parser: argparse.ArgumentParser = self.actions.add_parser(
            name, parents=[self.store], help=help_text, description=description, **options
        )
        parser.set_defaults(handler=handler)
        return parser

    def run(
        self, name: str, handler: Handler, help_text: str | None = None
    ) -> argparse.ArgumentParser:
        """Add the command ``name`` on one run: RUN_ID first, then what the caller adds."""
        parser = self.add(name, handler, help_text)
        parser.add_argument("run_id", metavar="RUN_ID")
        return parser

    def group(
        self, name: str, help_text: str, description: str | None = None, dest: str = "action"
    ) -> Commands:
        """Add the command group ``name`` (``stepstone runs``): its actions, one required,
        are subcommands with the same parent."""
        parser = self.actions.add_parser(name, help=help_text, description=description)
        # The group's parser is of the top level's class: its actions' errors are too.
        actions = parser.add_subparsers(dest=dest, metavar="ACTION")
        actions.required = True
        return Commands(actions, self.store)


def _texts(handler: Handler | None) -> tuple[str, str | None]:
    """Return the help line and the description ``handler``'s docstring holds."""
    # The docstring as written, not ``inspect.getdoc``'s: the texts are reflowed below,
    # so its indentation does not matter, and building the parser (``--help``) then
    # imports neither ``inspect`` nor the ``ast`` and ``dis`` it brings.
    doc = handler.__doc__ if handler is not None else None
    if not doc:
        raise TypeError(f"{handler!r} has no docstring to be its command's help")
    first, _, rest = doc.partition("\n\n")
    # One line each, as they were written as arguments: argparse reflows them anyway.
    return " ".join(first.split()), " ".join(rest.split()) or None
