"""The checkpoint: what a store keeps for one run, and how it is validated."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from . import _clock
from ._errors import InvalidRunId, InvalidState
from ._frozen import Twin
from ._status import ACTIVE_STATUSES, STATUSES, RunStatus

__all__ = [
    "ACTIVE_STATUSES",
    "DUE_NOW",
    "MAX_RUN_ID_LENGTH",
    "PRIORITY_AGING",
    "READABLE_SCHEMAS",
    "SCHEMA_PIECES",
    "SCHEMA_VERSION",
    "STATUSES",
    "Checkpoint",
    "Failure",
    "RunStatus",
    "Signal",
    "Stored",
    "check_run_id",
    "evolve",
    "keep_times",
    "parked",
    "queued_due",
    "run_status",
    "utcnow",
]

#: Bumped whenever the stored layout changes; every stored checkpoint carries it so a
#: later release can migrate old documents instead of misreading them. Schema 2 added
#: the runtime fields (input, workflow, ownership, suspension); a schema 1 document is
#: a schema 2 document with every one of them at its default, so both are read.
SCHEMA_VERSION = 2
#: A document whose state is kept in pieces (``_statelog``): a release that reads only
#: schema 2 refuses it with "upgrade stepstone" instead of misreading it. Documents with
#: the state inline are still written as schema 2, so a mixed fleet shares small runs.
SCHEMA_PIECES = 3
READABLE_SCHEMAS = frozenset({1, 2, 3})

MAX_RUN_ID_LENGTH = 1024

# C0 controls, DEL, C1 controls, and lone surrogates (which cannot be encoded as UTF-8,
# so no backend could store them).
_BAD_RUN_ID_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def utcnow() -> datetime:
    """Return the current time of stepstone's clock (``_clock``), timezone-aware in UTC."""
    return _clock.now()


def check_run_id(run_id: object) -> str:
    """Return ``run_id`` if every backend can store it, else raise ``InvalidRunId``.

    Allowed: any ``str`` of 1 to 1024 characters without control characters. Slashes,
    dots, ``#``, ``?``, ``%``, spaces and non-ASCII are all fine: backends encode ids.
    """
    if not isinstance(run_id, str):
        raise InvalidRunId(f"run_id must be a str, got {type(run_id).__name__}")
    if not run_id or len(run_id) > MAX_RUN_ID_LENGTH:
        raise InvalidRunId(
            f"run_id must be 1 to {MAX_RUN_ID_LENGTH} characters long, got {len(run_id)}"
        )
    # Most ids are printable ASCII, which holds no control character and no surrogate:
    # two C scans instead of the search's call (every save checks its id). ``str``'s own
    # methods: a subclass's overrides must not vouch for its text.
    if str.isascii(run_id) and str.isprintable(run_id):
        return run_id
    bad = _BAD_RUN_ID_CHAR.search(run_id)
    if bad is not None:
        raise InvalidRunId(
            f"run_id contains the control or surrogate character {bad.group()!r} at position "
            f"{bad.start()}; allowed: any characters except control characters (U+0000-U+001F, "
            "U+007F-U+009F) and lone surrogates"
        )
    return run_id


@dataclass(frozen=True, slots=True)
class Failure:
    """Why the step after the last completed one failed, as saved for operators."""

    step_index: int
    step_name: str
    error_type: str
    message: str
    attempt: int
    at: datetime


@dataclass(frozen=True, slots=True)
class Signal:
    """A signal a run received: kept in its checkpoint until a ``WaitFor`` consumes it."""

    name: str
    id: str
    payload: Any
    at: datetime


@dataclass(frozen=True, slots=True, eq=False)
class Stored:
    """What a store knows of a saved state, carried by the checkpoint it returned.

    ``store`` is the store object that wrote or read it: a checkpoint carried to another
    store (a migration) is saved there whole, never as a change to pieces only the first
    store holds. ``version`` is the document version it belongs to.
    """

    store: int  # the store object's serial (``_statelog.serial``)
    run_id: str
    version: str | None
    gen: int
    ref: dict[str, Any] | None  # None: the state is inline
    private: dict[str, Any] | None  # the decoded stored state (chunked states only)
    handed: dict[str, Any] | None  # the state handed out beside it
    history: str | None = None  # the key of the run's latest history record, if kept
    #: The log chain this writer appends to (``_statelog``): its piece-key prefix and
    #: counter, shared by the handles of one writer's successive saves on one base.
    chain: Any = None
    #: The run's incarnation (``_statelog``), which every piece key of its lineage
    #: starts with; None: none yet, or a legacy lineage (keys without one).
    inc: str | None = None
    #: Where ``private``'s compared containers hold numbers (``_statediff.Numbers``), so
    #: the next save checks only those for a change of type; None: none found yet.
    numbers: Any = None
    #: Top-level keys whose lists the next save trusts to have only grown
    #: (``_append_only``; set by the runner before each save, never stored).
    append_only: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The saved progress of one run.

    Attributes:
        run_id: The run this checkpoint belongs to.
        step: Index of the last completed step; -1 when none has completed yet (a run
            whose first step failed or is being retried).
        state: The accumulated JSON state after ``step``.
        version: Opaque token of the stored version; None before the first save. A save
            succeeds only if the store still holds exactly this version.
        step_names: Names of the completed steps, in order (``len == step + 1``).
        total_steps: How many steps the workflow had at the last save, so ``status`` is
            known from the checkpoint alone.
        attempt: Attempts begun on the next step (``step + 1``); saved before each retried
            attempt so a crash does not reset the count.
        failure: The last failure of the next step, cleared once it succeeds.
        created_at: When the run was first saved.
        updated_at: When this checkpoint was saved.
        input: The initial state the run was started with, recorded at its first save.
        workflow: Name of the ``Workflow`` the run was started from, if any.
        workflow_version: That workflow's version, if it has one.
        queued: Started by ``start`` and not yet claimed by a worker.
        cancelled: Cancelled; the run is at rest and runs nothing more.
        cancel_requested: ``cancel`` asked the owner to stop at its next step boundary.
        owner: Who holds the lease (a worker or a direct ``run`` call), None when free.
        epoch: Fencing epoch: bumped by every claim, so a stale owner's write is refused.
        lease: Seconds the owner promised to renew within; expiry is judged by a
            claimant's monotonic clock seeing no write of the owner's for that long
            (``_lease.owner_mark``: signals and cancel requests do not count).
        renewed_at: The owner's wall-clock time of its last write (claim, renewal or
            save); compared only with itself, never with another clock.
        waiting_for: What a waiting run waits for (``signal approval``, ``timer``,
            ``children 3 of 10``); None when not waiting.
        wake_at: When a waiting run is due (timer, timeout, child poll); None if only a
            signal can wake it.
        signals: Every signal received, in arrival order.
        consumed: How many signals of each name ``WaitFor`` steps have consumed.
        parent: The run_id of the parent run, for a ``Map`` child.
        children: The child run_ids of the ``Map`` step the run is at, while it runs.
        history: Every save of the run is kept (``stepstone.history``, ``fork``,
            ``rerun``); set when the run starts, kept by every later save.
        streams: Event streams (``stepstone._stream``): step index -> the token of the
            attempt that committed that step, for steps whose committing attempt emitted
            events. Readers hide the events of every other attempt of a committed step.
        timing: The run's deadline (``Workflow(deadline=)``, ``start(deadline=)``):
            its length, the time it falls at (fixed at the first claim, inherited by a
            ``Map``'s children) and what happens then; None without one.
        flow: Flow control: ``{"keys": [...], "limits": {key: config}, "priority": n}``
            as ``start`` recorded it; None for a run with no keys and priority 0.
    """

    run_id: str
    step: int = -1
    state: dict[str, Any] = field(default_factory=dict)
    version: str | None = None
    step_names: tuple[str, ...] = ()
    total_steps: int | None = None
    attempt: int = 0
    failure: Failure | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    # The JSON text of ``state`` as stored, set by the store that produced this object.
    # Lets the runner rebuild the pristine state after a step mutated its working copy
    # without encoding the state a second time on every step.
    state_json: str | None = field(default=None, repr=False, compare=False)
    input: dict[str, Any] | None = None
    workflow: str | None = None
    workflow_version: str | None = None
    queued: bool = False
    cancelled: bool = False
    cancel_requested: bool = False
    owner: str | None = None
    epoch: int = 0
    lease: float | None = None
    renewed_at: datetime | None = None
    waiting_for: str | None = None
    wake_at: datetime | None = None
    signals: tuple[Signal, ...] = ()
    consumed: dict[str, int] = field(default_factory=dict)
    parent: str | None = None
    children: tuple[str, ...] = ()
    history: bool = False
    # --- streams (issue 34): the committing attempt of each step that emitted ---------
    streams: dict[str, str] = field(default_factory=dict)
    #: Issue 33 (``_deadline``): the run's deadline, ``{"deadline": seconds from the
    #: first claim, "deadline_at": ISO time, "on_deadline": "fail" | "wait"}``, each key
    #: optional; None for runs without one. Namespaced: one field for time control.
    timing: dict[str, Any] | None = None
    #: Flow control (issue 37, ``_flow``): the run's own limit keys, the limits its
    #: workflow declared for them, and its priority (``start(keys=, priority=)``).
    flow: dict[str, Any] | None = None
    # What the store that produced this object knows of the stored state (``_statelog``):
    # lets the next save of a long run write only what changed. Never compared or shown.
    stored_state: Stored | None = field(default=None, repr=False, compare=False)

    def stored(
        self,
        state: dict[str, Any],
        state_json: str | None,
        version: str,
        now: datetime,
        stored_state: Stored | None = None,
    ) -> Checkpoint:
        """Return this checkpoint as a store saved it (a helper for backends).

        Inside ``Store.import_checkpoint`` the checkpoint's own ``updated_at`` is kept,
        so a migrated run keeps its age.
        """
        if self.updated_at is not None and keep_times.get():
            now = self.updated_at
        return _stored_copy(
            self, state, version, self.created_at or now, now, state_json, stored_state
        )

    @property
    def status(self) -> RunStatus:
        """The run's status, from the checkpoint alone (see ``run_status``).

        A failure saved while the owner keeps its lease is a retry in progress (the owner
        waits out the backoff, renewing): the run is ``running``, so that a worker takes
        it over if that owner dies, and a Map parent does not take a retrying child for
        a failed one. A final failure gives the lease back: ``failed``.
        """
        return run_status(
            self.step,
            self.total_steps,
            self.failure is not None and self.owner is None,
            queued=self.queued,
            waiting=self.waiting_for is not None,
            cancelled=self.cancelled,
        )

    @property
    def due_at(self) -> datetime | None:
        """When a worker should next look at this run; None when nothing is due.

        Queued runs are due at once (``queued_due``: in priority order), waiting runs at
        ``wake_at``, running runs at their owner's promised lease end (a hint for ordering
        and display: a takeover is decided by observation, never by comparing this with a
        clock).
        Stores index it with the status so that finding work never scans finished runs.

        A waiting run is due now, whatever ``wake_at`` says, when it holds an unconsumed
        signal it waits for (its owner may have died between saving the wait, re-based on
        that signal, and consuming it) or when it has an owner (one that re-claimed it to
        act on a signal or cancel request, and whose lease someone must watch).
        """
        status = self.status
        if status == "queued":
            flow = self.flow
            return queued_due(self.created_at, int(flow.get("priority", 0)) if flow else 0)
        if status == "waiting":
            if self.owner is not None or self._signalled():
                return DUE_NOW
            return self.wake_at
        if status == "running":
            if self.renewed_at is not None and self.lease is not None:
                return self.renewed_at + timedelta(seconds=self.lease)
            return self.updated_at or _EPOCH
        return None

    def _signalled(self) -> bool:
        """Return whether a signal this waiting run waits for was received, unconsumed."""
        waiting_for = self.waiting_for
        if not self.signals or waiting_for is None or not waiting_for.startswith("signal "):
            return False
        name = waiting_for[7:]
        received = sum(1 for s in self.signals if s.name == name)
        return received > self.consumed.get(name, 0)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Set by ``Store.import_checkpoint``: saves keep the checkpoint's timestamps.
keep_times: ContextVar[bool] = ContextVar("stepstone_keep_times", default=False)
#: The ``wake_at`` that means "due now": before any clock's now, so a worker whose clock
#: is behind the writer's (who queued, signalled or nudged) still finds the run due.
DUE_NOW = _EPOCH
#: Seconds of waiting worth one level of priority: a queued run and a run waiting for a
#: limit key (``_flow._bucket``) go before those of ``n`` levels higher that came
#: ``n * PRIORITY_AGING`` seconds after them, so none waits forever behind higher ones.
PRIORITY_AGING = 60.0
# Queued runs' due times are their order compressed this many times into the year after
# DUE_NOW: before any clock's now, after DUE_NOW itself (a signalled or nudged run).
_QUEUE_SCALE = 1000.0


def queued_due(created_at: datetime | None, priority: int) -> datetime:
    """The ``due_at`` of a queued run: due at once by any clock, in the order to claim it.

    Claims take due runs in ``due_at`` order on every store (the status and ``due_at``
    index), so a queued run's is ``created - priority * PRIORITY_AGING`` (seconds),
    compressed into January 1970: higher priorities first, then the longest queued, with
    or without a limit key. ``created_at`` is the queuing host's clock: an order only,
    never a time compared with another clock.
    """
    rank = (created_at.timestamp() if created_at is not None else 0.0) - priority * PRIORITY_AGING
    return DUE_NOW + timedelta(seconds=max(0.0, rank) / _QUEUE_SCALE)


# Building and copying checkpoints (every save and every step does both) on a twin class
# (``_frozen``): about a third of the instructions of setting the 28 slots one setter
# call at a time. The generated functions only ever hand out finished ``Checkpoint``s.
_TWIN = Twin(Checkpoint)
_FIELDS = _TWIN.fields
_compile = _TWIN.compile


def _make_evolve() -> Any:
    """Build ``evolve``: ``dataclasses.replace`` for Checkpoint, minus its generic work.

    ``replace`` inspects the fields and calls the frozen ``__init__`` on every call
    (about 7 us for 28 fields); the save path copies a checkpoint on every step, so
    the copy is generated once here: each field from the keyword or from ``self``.
    """
    params = "self, *, " + ", ".join(f"{name}=_M" for name in _FIELDS)
    values = {name: f"self.{name} if {name} is _M else {name}" for name in _FIELDS}
    return _compile("evolve", params, values, {"_M": object()})


if TYPE_CHECKING:
    # What the type checker sees: one keyword-only parameter per field of
    # ``Checkpoint``, written out, so that a misspelt or mistyped field
    # (``evolve(cp, cancelld=True)``) is refused before it runs. ``tests/engine/test_evolve.py``
    # keeps the list equal to the fields. At run time ``evolve`` is the generated copy
    # below (same parameters), and this costs nothing: it is never executed.
    def evolve(
        cp: Checkpoint,
        /,
        *,
        run_id: str = ...,
        step: int = ...,
        state: dict[str, Any] = ...,
        version: str | None = ...,
        step_names: tuple[str, ...] = ...,
        total_steps: int | None = ...,
        attempt: int = ...,
        failure: Failure | None = ...,
        created_at: datetime | None = ...,
        updated_at: datetime | None = ...,
        state_json: str | None = ...,
        input: dict[str, Any] | None = ...,
        workflow: str | None = ...,
        workflow_version: str | None = ...,
        queued: bool = ...,
        cancelled: bool = ...,
        cancel_requested: bool = ...,
        owner: str | None = ...,
        epoch: int = ...,
        lease: float | None = ...,
        renewed_at: datetime | None = ...,
        waiting_for: str | None = ...,
        wake_at: datetime | None = ...,
        signals: tuple[Signal, ...] = ...,
        consumed: dict[str, int] = ...,
        parent: str | None = ...,
        children: tuple[str, ...] = ...,
        history: bool = ...,
        streams: dict[str, str] = ...,
        timing: dict[str, Any] | None = ...,
        flow: dict[str, Any] | None = ...,
        stored_state: Stored | None = ...,
    ) -> Checkpoint:
        """Return a copy of ``cp`` with the fields given changed, like ``dataclasses.replace``."""
        ...

else:
    evolve = _make_evolve()

_STORED_FIELDS = ("state", "version", "created_at", "updated_at", "state_json", "stored_state")


def _make_stored_copy() -> Any:
    """Build the copy ``Checkpoint.stored`` makes: five new fields, the rest from ``self``.

    Positional arguments and no per-field test: the one copy a store makes per save.
    """
    values = {name: f"self.{name}" for name in _FIELDS}
    values.update({name: name for name in _STORED_FIELDS})
    return _compile("stored_copy", "self, " + ", ".join(_STORED_FIELDS), values, {})


_stored_copy: Callable[
    [Checkpoint, dict[str, Any], str, datetime, datetime, str | None, Stored | None], Checkpoint
] = _make_stored_copy()


# The dataclass ``__init__``, minus ``object.__setattr__`` per field (``_frozen``).
Checkpoint.__init__ = _TWIN.init()  # type: ignore[method-assign]
Stored.__init__ = Twin(Stored).init()  # type: ignore[method-assign]


def parked(cp: Checkpoint, index: int, name: str, why: Exception, advice: str) -> Checkpoint:
    """``cp`` failed at step ``index`` (``name``) with ``why``, to be saved as parked.

    A parked run's steps cannot resume its record (``WorkflowChanged``): as a failure it
    leaves the claim index, and the message says who parked it and how to resume it
    (``advice``). ``waiting_for`` is cleared: a waiting run's status would hide the failure.
    """
    failure = Failure(index, name, type(why).__name__, f"{why}. {advice}", 0, utcnow())
    return evolve(cp, failure=failure, attempt=0, waiting_for=None, wake_at=None)


def run_status(
    step: int,
    total_steps: int | None,
    failed: bool,
    *,
    queued: bool = False,
    waiting: bool = False,
    cancelled: bool = False,
) -> RunStatus:
    """Return a run's status from its stored fields (for backends that list without loading).

    In order: ``cancelled``; ``done`` when every recorded step completed; ``queued``
    until a worker claims it; ``waiting`` while suspended; ``failed`` after a saved
    failure; else ``running``.
    """
    if cancelled:
        return "cancelled"
    if total_steps is not None and step + 1 >= total_steps:
        return "done"
    if queued:
        return "queued"
    if waiting:
        return "waiting"
    return "failed" if failed else "running"


def find_non_json(value: object, path: str = "state") -> tuple[str, str] | None:
    """Return ``(path, reason)`` of the first value that would not round-trip through JSON."""
    # The walk below names each value's path as it goes (a repr and a format per value);
    # most values are plain JSON, and proving that needs no names (the LangGraph saver
    # asks it of every checkpoint's metadata): the paths only when something is wrong.
    if _plain_json(value):
        return None
    return _find_non_json(value, path)


_SCALARS = (bool, int, type(None))


def _plain_json(value: object) -> bool:
    """Whether ``find_non_json`` finds nothing in ``value``: its rules, without paths."""
    if isinstance(value, str):
        # isascii() reads a flag CPython keeps (O(1)): no lone surrogate in ASCII text.
        return value.isascii() or _SURROGATE.search(value) is None
    if isinstance(value, _SCALARS):
        return True
    if isinstance(value, float):
        return not (math.isnan(value) or math.isinf(value))
    if isinstance(value, dict):
        for key, item in value.items():  # loops, not all(...): no generator per container
            if not isinstance(key, str) or not _plain_json(key) or not _plain_json(item):
                return False
        return True
    if isinstance(value, list):
        return all(map(_plain_json, value))
    return False


def _find_non_json(value: object, path: str) -> tuple[str, str] | None:
    if isinstance(value, str):
        if _SURROGATE.search(value):
            return path, "the string holds a lone surrogate, which is not UTF-8"
        return None
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return path, f"{value!r} is not allowed in JSON"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and _SURROGATE.search(key):
                return f"{path}[{key!r}]", "the key holds a lone surrogate, which is not UTF-8"
            if not isinstance(key, str):
                return (
                    f"{path}[{key!r}]",
                    f"key {key!r} is a {type(key).__name__}; JSON object keys must be str",
                )
            found = _find_non_json(item, f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _find_non_json(item, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    kind = type(value).__name__
    hint = " (use a list)" if isinstance(value, (tuple, set, frozenset)) else ""
    return path, f"a {kind} is not JSON{hint}"


def invalid_state(state: object, cause: str | None = None) -> InvalidState:
    """Build the error for a state that failed to encode, naming the bad value's path."""
    if not isinstance(state, dict):
        return InvalidState(
            f"state must be a dict with str keys, got {type(state).__name__}", "state"
        )
    try:
        found = find_non_json(state)
    except RecursionError:
        found = ("state", "it is nested too deeply to encode")
    if found is None:
        path, reason = "state", cause or "it does not round-trip through JSON"
    else:
        path, reason = found
    return InvalidState(
        f"{path}: {reason}; a state must be JSON: dict with str keys, list, str, int, "
        "finite float, bool or None",
        path,
    )
