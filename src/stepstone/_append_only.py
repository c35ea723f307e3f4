"""Append-only lists: ``Workflow(append_only=["messages"])``, an explicit trade (issue 36).

A long state's save writes only what the step changed (``_statelog``). To know that a
list only grew, it compares every stored item with its private copy: a step may have
changed one in place (``state["messages"][3]["content"] = ...``), and that change must
be stored. The comparison costs a few hundred instructions per item per save, so a run
whose transcript grows by one message a step does work quadratic in its length: at
1,000 steps it is most of the run.

A workflow may declare top-level state keys whose lists its steps only append to. For
those, a save compares only the stored list's last ``CHECKED`` items (the ones a step
is likely to edit, such as the message being streamed into); older items are taken as
unchanged without being looked at. The trade, stated in the API docs: a step that
changes an older item of such a list in place, or replaces it with another object, has
that change not stored by that save; a later save that writes the state whole (a new
base of the state log) stores whatever the run holds then. Until then the run goes on
with the step's value, and a resumed run with the stored one. A list that got shorter,
or a key set to something other than a list, is still saved exactly; so is every key
not declared. Without ``append_only`` nothing is trusted: every item is compared.

Why a window rather than nothing: the last items are where in-place edits happen in
practice, and checking them keeps a save's cost constant while the common mistakes are
still stored right. Why not hand steps frozen items instead (changes impossible, so no
trust needed): a step passes its messages to model clients and serializers that expect
plain dicts and lists, and a dict subclass that refuses changes breaks ``copy``,
``pickle`` and ``type(x) is dict`` checks in code stepstone does not own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from ._checkpoint import Checkpoint, Stored, evolve
from ._errors import InvalidWorkflow

__all__ = ["CHECKED", "check_append_only", "trusting"]

#: How many of an append-only list's last stored items a save still compares.
CHECKED = 16


def check_append_only(workflow: str, keys: Iterable[str] | None) -> frozenset[str]:
    """Return ``keys`` as a frozenset of top-level state keys, or raise ``InvalidWorkflow``."""
    if keys is None:
        return frozenset()
    if isinstance(keys, (str, bytes)):
        raise InvalidWorkflow(
            f"workflow {workflow!r}: append_only must be a list of top-level state keys, "
            f"not one string; write append_only=[{keys!r}]"
        )
    try:
        found = list(keys)
    except TypeError:
        raise InvalidWorkflow(
            f"workflow {workflow!r}: append_only must be a list of top-level state keys "
            f"(str), got {type(keys).__name__}"
        ) from None
    for key in found:
        if not isinstance(key, str) or not key:
            raise InvalidWorkflow(
                f"workflow {workflow!r}: append_only holds {key!r}; each item must be a "
                "non-empty str naming a top-level state key whose list steps only append to"
            )
    return frozenset(found)


def trusting(cp: Checkpoint, keys: frozenset[str]) -> Checkpoint:
    """``cp`` whose save trusts ``keys``' lists to have only grown (see the module doc).

    Only a long state's handle carries it; an inline state is written whole anyway.
    """
    handle: Any = cp.stored_state
    if not keys or not isinstance(handle, Stored) or handle.append_only == keys:
        return cp
    return evolve(cp, stored_state=replace(handle, append_only=keys))
