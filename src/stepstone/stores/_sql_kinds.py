"""The SQL statements written once per kind of run claimed, and how they are filled in.

``claim_ready`` repeats one branch per kind (waiting, running, queued) and ``claims``
(``claimable``'s pages) one statement per status: ``_sql_text`` holds each once, with
``@name@`` markers, and ``expand`` fills them in when it is imported. ``tools/sqlgen.py``
builds the text with these same functions, and its ``--check`` compares the filled-in
text. A leaf module: ``_sql_text`` imports it, and it imports nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PerKind", "expand", "fill", "kinds"]

#: ``claim_ready`` as [head, branch, joiner, tail, due test, cancel test]: the branch
#: once per kind of ``kinds``, its ``@name@`` markers filled in (``fill``); ``claims``
#: as [templates, conditions]: each template once per condition, for ``@where@``.
PerKind = list[Any]


def kinds(due: str, cancelled: str) -> list[dict[str, str]]:
    """The three kinds ``claim_ready`` claims: what fills a branch's ``@status@``, ``@due@``
    (its due test) and ``@cancel@`` (its extra test).

    One branch each, every one an index range scan on (status, due_at) that stops at
    ``limit`` matches: an ``OR`` of the statuses would sort every due run (and parse
    each one's metadata) before the ``LIMIT``. Waiting runs first (resumed work), then
    runs given back, then new runs; the union is cut to ``limit`` by due_at.
    """
    return [
        {"status": status, "due": due_test, "cancel": cancel}
        for status, due_test, cancel in (
            ("waiting", due, ""),
            ("running", "", ""),
            ("queued", due, cancelled),
        )
    ]


def fill(template: str, kind: dict[str, str]) -> str:
    """Return ``template`` with each ``@name@`` in it replaced by ``kind[name]``."""
    for name, text in kind.items():
        template = template.replace(f"@{name}@", text)
    return template


def expand(parts: dict[str, PerKind]) -> dict[str, Any]:
    """Return ``claim_ready`` and ``claims`` from their branches written once."""
    head, branch, joiner, tail, due, cancelled = parts["claim_ready"]
    templates, conditions = parts["claims"]
    return {
        "claim_ready": head
        + joiner.join(fill(branch, kind) for kind in kinds(due, cancelled))
        + tail,
        "claims": [
            tuple(fill(text, {"where": where}) for text in templates) for where in conditions
        ],
    }
