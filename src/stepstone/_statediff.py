"""What a save changed: the diff of a state against its stored copy, and the copy's edits.

The write side of ``_statelog``'s log pieces: ``_diff`` lists the operations (``s``
set, ``x`` append, ``d`` delete) between a step's new state and the private copy of
the stored one; the helpers below apply them to the private copy (copy-on-write) and
to the state handed back to the caller.
"""

from __future__ import annotations

from operator import is_
from typing import Any

from ._codec import copy_containers


def _containers(value: Any) -> Any:
    """A copy of ``value``'s dicts and lists, sharing its (immutable) scalars.

    The private copy shares strings with the handed state on purpose: the next save's
    equality test then finds them identical at once instead of comparing their text.
    """
    return copy_containers(value)


_MISSING: Any = object()


def _diff(
    path: tuple[str, ...],
    new: dict[str, Any],
    handed: dict[str, Any] | None,
    old: dict[str, Any],
    out: list[tuple[tuple[str, ...], str, Any]],
) -> bool:
    """Append ``(path, op, value)`` for what differs between ``new`` and ``old``.

    Returns False when the change cannot be expressed (a key that is not a str, which
    the whole-state path refuses with its message).
    """
    if handed is None:
        handed = {}
    for key, value in new.items():
        if type(key) is not str:
            return False
        before = old.get(key, _MISSING)
        if before is _MISSING:
            out.append(((*path, key), "s", value))
            continue
        given = handed.get(key, _MISSING)
        kind = type(value)
        if value is given and kind is type(before) and value == before:
            continue  # the object handed out, unchanged in place
        if kind is list and type(before) is list:
            n = len(before)
            if len(value) >= n and type(given) is list and len(given) >= n:
                # The handed list's first n items (the list itself unless the step grew it
                # in place). Once value's head is those very objects, comparing the handed
                # head with the private copy is comparing value's: no slice of value, and
                # map stops at the head's end without islice's two iterators per item.
                head = given if len(given) == n else given[:n]
                if (value is given or all(map(is_, value, head))) and head == before:
                    if len(value) > n:
                        out.append(((*path, key), "x", value[n:]))
                    continue
        elif kind is dict and type(before) is dict:
            if not _diff((*path, key), value, given if type(given) is dict else None, before, out):
                return False
            continue
        out.append(((*path, key), "s", value))
    if len(new) < len(old) or any(key not in new for key in old):
        out.extend(((*path, key), "d", None) for key in old if key not in new)
    return True


def _parent(node: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """The dict holding ``path``'s last key, each dict above it in ``node`` a fresh copy."""
    for key in path[:-1]:
        child = dict(node[key])
        node[key] = child
        node = child
    return node


# The private state is never changed in place (a racing save of the same handle may be
# reading it): each change copies the dicts on its path, and a list it extends.
def _with(state: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    top = dict(state)
    _parent(top, path)[path[-1]] = value
    return top


def _extended(state: dict[str, Any], path: tuple[str, ...], items: list[Any]) -> dict[str, Any]:
    return _with(state, path, _at(state, path) + items)  # one C copy of the stored head


def _without(state: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    top = dict(state)
    del _parent(top, path)[path[-1]]
    return top


# The handed state is the caller's: its dicts on a changed path are copied (the step's
# own objects are not changed under it), the changed values are fresh copies.
def _set_in(state: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    _parent(state, path)[path[-1]] = value


def _extend_in(state: dict[str, Any], path: tuple[str, ...], items: list[Any], keep: int) -> None:
    """Replace the list at ``path`` by its first ``keep`` items (the stored ones), then
    ``items`` (fresh copies of the step's new ones)."""
    node = _parent(state, path)
    kept = node[path[-1]][:keep]  # one C slice, no iterator per item
    kept += items
    node[path[-1]] = kept


def _at(state: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = state
    for key in path:
        node = node[key]
    return node


def _del_in(state: dict[str, Any], path: tuple[str, ...]) -> None:
    _parent(state, path).pop(path[-1], None)
