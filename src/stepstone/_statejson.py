"""A state as JSON: ``encode_state``'s round trip, its fast paths, and the depth rule.

The state half of ``_codec`` (which lays out the documents): what a state may hold is
decided here, once, for every backend. ``encode_state`` refuses whatever JSON would
change (int keys, tuples, NaN, lone surrogates) or could not load again from every call
stack (``MAX_DEPTH``); orjson (``stepstone[fast]``) and the plain walk only make the
same answer faster.
"""

from __future__ import annotations

import json
from itertools import chain, compress, repeat
from math import isfinite as _isfinite
from operator import is_
from typing import Any

from ._checkpoint import _plain_json, invalid_state
from ._errors import InvalidState

__all__ = [
    "MAX_DEPTH",
    "copy_containers",
    "decode_json",
    "dump_json",
    "encode_state",
    "encode_state_as_written",
    "is_json",
    "orjson_module",
]

_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode
_loads = json.loads
#: The stored JSON form (compact, UTF-8 as is, no NaN) and its reader, for ``_statelog``.
dump_json = _dumps
decode_json = _loads

_UNSET: Any = object()
#: orjson (the optional extra ``stepstone[fast]``), None without it; imported on the
#: first save, not with ``import stepstone`` (it imports uuid and platform itself).
_orjson: Any = _UNSET


def _load_orjson() -> Any:
    global _orjson  # noqa: PLW0603 - a lazily imported module, set once
    try:
        # Deferred: an optional extra, imported on the first save (see ``_orjson``).
        import orjson  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
    except ImportError:  # pragma: no cover - exercised where orjson is absent
        orjson = None  # type: ignore[assignment,unused-ignore]
    _orjson = orjson
    return orjson


def encode_state(state: object) -> tuple[str, dict[str, Any]]:
    """Return ``(json_text, fresh_copy)`` of ``state``, or raise ``InvalidState``.

    ``encode_state_as_written`` is the same with the JSON in the form its writer made
    it, for what stores bytes (a long state's pieces).
    """
    written, copy = encode_state_as_written(state)
    return (written.decode("utf-8") if isinstance(written, bytes) else written), copy


def encode_state_as_written(state: object) -> tuple[str | bytes, dict[str, Any]]:
    """``(json, fresh_copy)`` of ``state``: the JSON as orjson wrote it (UTF-8 bytes) or
    as the standard library did (``str``); or raise ``InvalidState``.

    Neither form is converted to the other here, so a caller that stores bytes never
    has orjson's bytes made a ``str`` and encoded back (issue 36: for a long state,
    two copies of its text per save).

    Round-trips the state and compares: this catches what ``json.dumps`` quietly
    changes (int keys become strings, tuples become lists) at C speed, and the decoded
    copy is exactly what a later load returns, so the runner hands it to the next step.

    With orjson installed (``stepstone[fast]``) the round trip is tried with it first,
    about nine times faster. Whatever orjson does not accept exactly as the standard
    library does (integers over 64 bits, NaN, which it writes as null, lone surrogates,
    non-str keys, nesting past 254 levels) fails its comparison or raises, and falls
    back to the standard-library path below, which alone decides what is refused: the
    refusals are the same with or without orjson.

    Most states are plain (see ``_plain_dict``): for those the copy is built by walking
    the state and the text written from it, instead of parsing the text back and
    comparing, which costs per value rather than per byte (a transcript's long strings
    are shared, being immutable, not copied).
    """
    if type(state) is not dict:
        raise invalid_state(state)
    module = _load_orjson() if _orjson is _UNSET else _orjson
    if module is not None:
        try:
            plain: dict[str, Any] | None = _plain_dict(state, 1)
        except (_NotPlain, RecursionError):
            plain = None
        try:
            if plain is not None:
                # The text is written from the copy, so the two agree even if another
                # thread changes the state meanwhile.
                return module.dumps(plain), plain
            raw: bytes = module.dumps(state)
            fast: dict[str, Any] = module.loads(raw)
            if fast == state:
                _check_depth(fast, raw)
                return raw, fast
        except (TypeError, ValueError, RecursionError):
            pass
    try:
        text = _dumps(state)
    except (TypeError, ValueError, RecursionError) as exc:
        raise invalid_state(state, str(exc)) from exc
    try:
        copy = _loads(text)
        same = copy == state
    except RecursionError as exc:
        raise invalid_state(state, "it is nested too deeply") from exc
    if not same:
        raise invalid_state(state)
    try:
        # Lone surrogates survive json.dumps with ensure_ascii=False but are not UTF-8:
        # refuse them here so that no backend fails on them halfway through a write.
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid_state(state, "a string holds a lone surrogate, which is not UTF-8") from exc
    _check_depth(copy, text)
    return text, copy


class _NotPlain(Exception):
    """``_plain_dict`` met something that is not plain; the round trip decides it."""


_PLAIN_SCALARS = frozenset((str, int, bool, type(None)))


# Why, for a plain state, the copy equals ``orjson.loads(text)`` and the state (so the
# round trip and its comparison would have accepted it, with this text). Plain: every
# dict and list is exactly a dict or list, every key exactly a str, every other value
# exactly a str, int, bool, None or finite float, and no value lies past MAX_DEPTH:
# - the walk stops at level MAX_DEPTH, so a cycle is never followed for ever; the copy
#   it builds is a tree equal to the state, with the same keys and items in order;
# - ``encode_state`` uses the copy only if orjson.dumps of it succeeded, so no string
#   holds a lone surrogate and no int is past 64 bits (orjson raises on those);
# - orjson writes each such value as JSON that reads back equal and of the same type:
#   str, int, true/false, null, and finite floats in their shortest form that reads
#   back to the same double (-0.0 included);
# - every dict and list is a new one (a list held twice is copied twice, as parsing
#   would), and each scalar is the state's own object: immutable, so sharing it is
#   what an equal fresh object would be.
# And the depth rule holds (``_check_depth``). Anything else (a subclass, a tuple, NaN,
# a datetime orjson writes as a string, a value at level 201, an int past 64 bits) goes
# the way it always went, which decides alone what is refused and with which path.
def _plain_dict(value: dict[str, Any], level: int) -> dict[str, Any]:
    """Return a fresh copy of a plain dict at ``level``, or raise ``_NotPlain``."""
    if level >= MAX_DEPTH and value:
        raise _NotPlain
    scalars = _PLAIN_SCALARS
    copy: dict[str, Any] = {}
    for key, item in value.items():
        kind = type(item)
        if type(key) is not str:
            raise _NotPlain
        if kind in scalars:
            copy[key] = item
        elif kind is dict:
            copy[key] = _plain_dict(item, level + 1)
        elif kind is list:
            copy[key] = _plain_list(item, level + 1)
        elif kind is float and _isfinite(item):
            copy[key] = item
        else:
            raise _NotPlain
    return copy


def _plain_list(value: list[Any], level: int) -> list[Any]:
    """Return a fresh copy of a plain list at ``level``, or raise ``_NotPlain``."""
    if level >= MAX_DEPTH and value:
        raise _NotPlain
    scalars = _PLAIN_SCALARS
    if scalars.issuperset(map(type, value)):
        return value[:]  # scalars only (floats aside): copied at C speed
    copy: list[Any] = []
    append = copy.append
    for item in value:
        kind = type(item)
        if kind in scalars:
            append(item)
        elif kind is dict:
            append(_plain_dict(item, level + 1))
        elif kind is list:
            append(_plain_list(item, level + 1))
        elif kind is float and _isfinite(item):
            append(item)
        else:
            raise _NotPlain
    return copy


#: Deepest nesting a state may have (the state itself is level 1). A state that only
#: just fits the encoder's recursion limit could not be loaded again from a deeper call
#: stack (a worker thread, a CLI command, a step that loads it): the limit keeps every
#: saved state loadable anywhere.
MAX_DEPTH = 200


def copy_containers(value: Any) -> Any:
    """A copy of ``value``'s dicts and lists, sharing its (immutable) scalars."""
    kind = type(value)
    if kind is dict:
        return {key: copy_containers(item) for key, item in value.items()}
    if kind is list:
        return [copy_containers(item) for item in value]
    return value


def _brackets(text: str | bytes) -> int:
    """How many ``[`` and ``{`` characters ``text`` (JSON, as str or UTF-8) holds."""
    if type(text) is bytes:
        return text.count(b"[") + text.count(b"{")
    assert type(text) is str
    return text.count("[") + text.count("{")


def _check_depth(copy: dict[str, Any], text: str | bytes) -> None:
    """Raise ``InvalidState`` if ``copy`` (the decoded state, ``text`` its JSON) is too deep.

    The rule, unchanged: ``copy`` is level 1 and each value inside a dict or list one
    level below it; a value of any kind (container or scalar) at a level past
    ``MAX_DEPTH`` is refused, so 199 nested lists under a key fit (the innermost, empty,
    is level 200) and 200 do not. One exception is kept exactly as it was: a state with
    at most ``MAX_DEPTH`` ``[`` and ``{`` characters in its text passes (the old check
    counted them first, to skip its walk), which lets through a lone chain of 200
    containers with a scalar at the bottom, at level 201.

    ``copy`` holds plain dicts and lists only, so ``type() is`` tells them apart. The
    walk goes level by level in C iterators (chain, map, compress): each value is looked
    at once, by its type, never its characters, so a 2 KB string costs what a small int
    costs; a level of scalars ends it, and at most ``MAX_DEPTH`` levels are walked
    whatever the nesting. Only a state already found too deep has its text counted.

    Why the whole state and not only what the step changed: a step is handed the state
    itself and may change it in place (``state["messages"].append(...)``), so no part
    of it is known unchanged without looking at it; the round trip in ``encode_state``
    looks at every value anyway. The two counts of the whole text this replaces were a
    third of a long run's instructions.
    """
    dicts: list[dict[str, Any]] = [copy]
    lists: list[list[Any]] = []
    for level in range(2, MAX_DEPTH + 2):  # the level of the values being looked at
        below = chain(chain.from_iterable(map(_values, dicts)), chain.from_iterable(lists))
        if level > MAX_DEPTH:
            deeper = next(below, _UNSET) is not _UNSET
            # Counted only now, for the one exception kept (see above).
            if deeper and _brackets(text) > MAX_DEPTH:
                raise InvalidState(
                    f"state: nested more than {MAX_DEPTH} levels deep; a state that deep "
                    "could not be loaded from every call stack. Flatten it (keep deep data "
                    "as a JSON string, say)",
                    "state",
                )
            return
        values = [*below]
        types = [*map(type, values)]
        kinds = set(types)
        if dict not in kinds and list not in kinds:
            return
        dicts = [*compress(values, map(is_, types, repeat(dict)))] if dict in kinds else []
        lists = [*compress(values, map(is_, types, repeat(list)))] if list in kinds else []


_values = dict.values


def orjson_module() -> Any:
    """orjson if it is installed (imported on the first call), else None."""
    return _load_orjson() if _orjson is _UNSET else _orjson


def is_json(value: object) -> bool:
    """Whether ``value`` is JSON by ``find_non_json``'s rules (the answer of its quick
    ``_plain_json``), at C speed where orjson can tell.

    The LangGraph saver asks this of every checkpoint's metadata and skeleton: with
    ``DeltaChannel``'s metadata (tuples) the walk, failing, then naming the path, cost
    108,000 instructions a checkpoint (issue 36); the round trip costs 36,000.
    Why its answer is the walk's: with the passthrough options orjson encodes only exact
    ``str``, ``int``, ``float``, ``bool``, ``None``, ``dict``, ``list``, ``tuple``,
    plain enums and UUIDs, and raises on anything else (a set, a subclass, a dataclass,
    a non-str key, an int past 64 bits, a lone surrogate, nesting past 254), which goes
    to the walk. Of what it encodes, a value reads back equal exactly when it is JSON:
    a tuple reads back a list (never equal to it), NaN and infinities read back null,
    an enum member or a UUID reads back its value or text (neither equal to it), and
    every exact str, int, bool, None and finite float reads back equal.
    """
    module = _load_orjson() if _orjson is _UNSET else _orjson
    if module is None:
        return _plain_json(value)
    # Declined, not encoded: dataclasses, datetimes and subclasses of the JSON types,
    # which orjson would write as dicts, strings or the base type (a lenient __eq__
    # could then read back "equal"); the walk decides them.
    strict = (
        module.OPT_PASSTHROUGH_DATACLASS
        | module.OPT_PASSTHROUGH_DATETIME
        | module.OPT_PASSTHROUGH_SUBCLASS
    )
    try:
        return bool(module.loads(module.dumps(value, option=strict)) == value)
    except (TypeError, ValueError, RecursionError):  # orjson.JSONEncodeError is a TypeError
        return _plain_json(value)
