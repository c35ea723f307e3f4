"""What a save changed: the diff of a state against its stored copy, and the copy's edits.

The write side of ``_statelog``'s log pieces: ``_diff`` lists the operations (``s``
set, ``x`` append, ``d`` delete) between a step's new state and the private copy of
the stored one; the helpers below apply them to the private copy (copy-on-write) and
to the state handed back to the caller.
"""

from __future__ import annotations

from itertools import chain, repeat
from math import copysign
from operator import getitem, is_
from typing import Any

from ._append_only import CHECKED
from ._codec import copy_containers


def _containers(value: Any) -> Any:
    """A copy of ``value``'s dicts and lists, sharing its (immutable) scalars.

    The private copy shares strings with the handed state on purpose: the next save's
    equality test then finds them identical at once instead of comparing their text.
    """
    return copy_containers(value)


_MISSING: Any = object()

#: Where a private container holds numbers: ``id(container) -> (container, groups)``.
#: The numbers are grouped by their path below the container's first key or index
#: (``("usage", "input_tokens")`` for every message of a transcript): a group maps that
#: path to its first keys (ascending indexes, in a list) and the numbers themselves. An entry
#: holds its container, so the id is not reused while the entry lives; private
#: containers are never changed in place, so an entry never goes stale.
Groups = dict[tuple[Any, ...], tuple[list[Any], list[Any]]]
Numbers = dict[int, tuple[Any, Groups]]

_NUMBER_TYPES = frozenset((bool, int, float))
_LEAVES = frozenset((str, type(None)))  # what holds no number and no container
_DICT = frozenset((dict,))


def _locate(value: Any, prefix: tuple[Any, ...], out: list[tuple[tuple[Any, ...], Any]]) -> None:
    """Append ``(location, number)`` (below ``prefix``) for every number inside ``value``.

    A container of text only, and a list of dicts of text only (a transcript), are told
    apart in C (a type per value) without a frame per item: this runs on every item a
    save appends, and over a whole list once per handle.
    """
    if type(value) is dict:
        if _LEAVES.issuperset(map(type, value.values())):
            return
        items: Any = value.items()
    else:
        if _LEAVES.issuperset(kinds := set(map(type, value))) or (
            kinds == _DICT
            and _LEAVES.issuperset(map(type, chain.from_iterable(map(dict.values, value))))
        ):
            return
        items = enumerate(value)
    for key, item in items:
        kind = type(item)
        if kind is dict or kind is list:
            _locate(item, (*prefix, key), out)
        elif kind in _NUMBER_TYPES:
            out.append(((*prefix, key), item))


def _grouped(container: Any, shift: int = 0) -> Groups:
    """The numbers of ``container`` as ``Groups``, first indexes moved on by ``shift``."""
    found: list[tuple[tuple[Any, ...], Any]] = []
    _locate(container, (), found)
    groups: Groups = {}
    for location, number in found:
        below = location[1:]
        group = groups.get(below)
        if group is None:
            group = groups[below] = ([], [])
        group[0].append(location[0] + shift if shift else location[0])
        group[1].append(number)
    return groups


def _same_json(new: Any, old: Any, seen: Numbers | None, keep: Numbers) -> bool:
    """Whether ``new``, already ``== old`` (a private container), is also the same JSON.

    ``==`` is not enough: ``1 == True == 1.0`` (and ``0.0 == -0.0``), so a number changed
    in place to an equal one of another type (a flag from 1 to True) would be taken as
    unchanged and never stored, while the run goes on with the new value. Among JSON's
    values only numbers compare equal across kinds (a str, None, dict or list equals only
    its own kind), so with ``==`` holding, comparing ``new``'s number at each place
    ``old`` has one is exact.

    The places are found once per container and carried from save to save (``seen`` the
    last save's, ``keep`` the next's; a list a save extends carries its head's,
    ``_carry``). Each group of them is read out of ``new`` in C (``map`` of ``getitem``) and
    compared by identity with ``old``'s numbers, which an unchanged state shares; only a
    group where one is not the same object is compared by type, in Python. A transcript
    of text costs nothing here, and each number about 1,000 instructions a save (a 400-
    step chat with two token counts a message: 1.58x), where comparing the whole text
    again (a strict walk, orjson) cost 10-15 times ``==``. Dict key order, which ``==``
    ignores, is not compared: no value is lost by it. In place of a number (or of a
    container holding one), a value equal without being JSON's (an object whose ``__eq__``
    says so) is read as a change: the save encodes it, and refuses it as usual.
    """
    entry = seen.get(id(old)) if seen is not None else None
    if entry is None or entry[0] is not old:
        entry = (old, _grouped(old))
    keep[id(old)] = entry  # for the next save, which compares ``old`` again
    try:
        return _numbers_agree(new, entry[1])
    except (TypeError, LookupError):
        return False  # not shaped as ``old``, though equal: not JSON's own values


def _numbers_agree(new: Any, groups: Groups) -> bool:
    """Whether ``new`` holds, at each group's places, the same numbers by identity or type."""
    for below, (firsts, numbers) in groups.items():
        if all(map(is_, _read(new, firsts, below), numbers)):
            continue
        for a, b in zip(_read(new, firsts, below), numbers, strict=True):
            if a is not b and (
                type(a) is not type(b)
                or (type(a) is float and copysign(1.0, a) != copysign(1.0, b))
            ):
                return False
    return True


def _read(new: Any, firsts: list[Any], below: tuple[Any, ...]) -> Any:
    """An iterator, in C, over ``new``'s values at each first key or index, then ``below``."""
    # A list whose every item has a value at ``below`` (each message its token count) is
    # read from directly: its firsts are then exactly 0..n-1.
    if type(new) is list and len(firsts) == len(new):
        values: Any = new
    else:
        values = map(getitem, repeat(new), firsts)
    for key in below:
        values = map(getitem, values, repeat(key))
    return values


def _carry(keep: Numbers, head: list[Any], longer: list[Any], tail: list[Any]) -> None:
    """Give ``longer`` (``head`` + ``tail``, a new private list) its numbers, from
    ``head``'s entry in ``keep`` and a walk of ``tail`` only."""
    entry = keep.get(id(head))
    if entry is None or entry[0] is not head:
        return  # looked up (and walked) only if a later save needs it
    groups = entry[1]  # an entry's groups are never changed once made: shared
    added = _grouped(tail, len(head))
    if added:
        groups = dict(groups)
        for below, group in added.items():
            had = groups.get(below)
            groups[below] = group if had is None else (had[0] + group[0], had[1] + group[1])
    keep[id(longer)] = (longer, groups)


def _diff(
    path: tuple[str, ...],
    new: dict[str, Any],
    handed: dict[str, Any] | None,
    old: dict[str, Any],
    out: list[tuple[tuple[str, ...], str, Any]],
    seen: Numbers | None,
    keep: Numbers,
    trusted: frozenset[str] = frozenset(),
) -> bool:
    """Append ``(path, op, value)`` for what differs between ``new`` and ``old``.

    ``seen`` and ``keep``: the number locations of ``_same_json``, from the last save
    and for the next. ``trusted``: the top-level keys whose lists only grow
    (``_append_only``): of their stored items only the last ``CHECKED`` are compared.
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
        if (
            value is given
            and kind is type(before)
            and value == before
            and ((kind is not dict and kind is not list) or _same_json(value, before, seen, keep))
        ):
            continue  # the object handed out, unchanged in place
        if kind is list and type(before) is list:
            n = len(before)
            if len(value) >= n and type(given) is list and len(given) >= n:
                if key in trusted and _grew(value, given, before, n):
                    if len(value) > n:
                        out.append(((*path, key), "x", value[n:]))
                    continue
                # The handed list's first n items (the list itself unless the step grew it
                # in place). Once value's head is those very objects, comparing the handed
                # head with the private copy is comparing value's: no slice of value, and
                # map stops at the head's end without islice's two iterators per item.
                head = given if len(given) == n else given[:n]
                if (
                    (value is given or all(map(is_, value, head)))
                    and head == before
                    and _same_json(head, before, seen, keep)
                ):
                    if len(value) > n:
                        out.append(((*path, key), "x", value[n:]))
                    continue
        elif kind is dict and type(before) is dict:
            handed_dict = given if type(given) is dict else None
            if not _diff((*path, key), value, handed_dict, before, out, seen, keep):
                return False
            continue
        out.append(((*path, key), "s", value))
    if len(new) < len(old) or any(key not in new for key in old):
        out.extend(((*path, key), "d", None) for key in old if key not in new)
    return True


def _grew(value: list[Any], given: list[Any], before: list[Any], n: int) -> bool:
    """Whether an append-only list's last ``CHECKED`` stored items are unchanged: the
    objects handed out, equal to the private copy's, of the same JSON. The items before
    them are trusted (``_append_only``); on False the caller compares them all."""
    start = n - CHECKED if n > CHECKED else 0
    window = given[start:n]
    prior = before[start:n]
    return (
        all(map(is_, value[start:n], window))
        and window == prior
        and _same_json(window, prior, None, {})  # slices: no carried number locations
    )


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
