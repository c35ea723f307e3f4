"""``stepstone runs tail``: print a run's event stream (issue 34), then follow it live."""

from __future__ import annotations

import argparse
import json
import sys

from ._commands import Commands
from ._common import EXIT_OK, existing, store_config
from ._output import _UNSAFE_IN_JSON, out, safe

__all__ = ["add_tail_parser"]


def add_tail_parser(actions: Commands) -> None:
    """Add ``runs tail`` to the ``runs`` actions."""
    tail = actions.run("tail", _tail)
    tail.add_argument("--topic", metavar="TOPIC", help="only events of this topic")
    tail.add_argument("--after", metavar="ID", help="only events after this event id")
    tail.add_argument(
        "--superseded", action="store_true", help="show superseded attempts' events, marked"
    )
    tail.add_argument("--no-follow", action="store_true", help="print what is stored now and stop")


def _tail(args: argparse.Namespace) -> int:
    """print a run's event stream and follow it until the run ends

    Print the events RUN_ID's steps emitted (ctx.emit), oldest first, then follow new ones
    live until the run is done, failed or cancelled. Events of attempts that did not commit
    their step are hidden (--superseded shows them, marked). --after ID resumes after an
    event id; --json prints one JSON object a line.
    """
    from .._stream import stream  # noqa: PLC0415 - the runtime, only when used

    with existing(store_config(args)) as store:
        events = stream(
            store,
            args.run_id,
            topic=args.topic,
            after=args.after,
            superseded=args.superseded,
            follow=not args.no_follow,
        )
        for event in events:
            if args.json:
                # One object a line (JSON Lines), so a pipe sees each event as it comes.
                text = json.dumps(event.to_json(), ensure_ascii=False)
                out(_UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m[0]):04x}", text))
                sys.stdout.flush()
                continue
            data = event.data if isinstance(event.data, str) else json.dumps(event.data)
            mark = " (superseded)" if event.superseded else ""
            out(f"{event.id} [{safe(event.topic)}] step {event.step}{mark}: {safe(data)}")
            sys.stdout.flush()  # each event as it comes, through a pipe too
    return EXIT_OK
