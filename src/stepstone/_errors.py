"""The exceptions stepstone raises, in one small tree.

Every error a caller can see is a ``StepstoneError``; the builtin base beside it
says what kind of mistake it is, so ``except ValueError`` still works::

    StepstoneError
    ├── ConfigError (ValueError)        bad config string, unknown scheme, missing extra
    ├── InvalidRunId (ValueError)       run_id empty, too long or with control characters
    ├── InvalidState (TypeError)        state that does not round-trip through JSON
    ├── InvalidWorkflow (TypeError, ValueError)  a malformed Step, RetryPolicy or step list
    ├── InputMismatch (ValueError)      resumed or started again with a different input
    ├── InvalidCharge (ValueError)      a bad ctx.charge/ctx.reserve: negative, not a number...
    ├── WorkflowChanged                 resumed with steps whose names differ from the record
    ├── StepFailed                      a step raised; the cause is ``__cause__``
    ├── Suspended                       the run waits (signal, timer, children); not an error
    ├── RunCancelled                    the run was cancelled; it runs nothing more
    ├── RunNotFound (LookupError)       no run has this run_id
    ├── RunNotActive (ValueError)       the run is done or cancelled: it cannot take that
    ├── StepTimeout (TimeoutError)      a step ran past its timeout (or idle timeout)
    ├── DeadlineExceeded                the run reached its deadline; it failed, recorded
    ├── ScheduleExists (ValueError)     a schedule of that name holds another spec
    ├── ScheduleNotFound (LookupError)  no schedule has that name
    └── StoreError                      anything a backend reports
        ├── ConflictError               compare-and-swap lost: someone else advanced the run
        │   ├── LeaseLost               another worker took the run over; stop, write nothing
        │   └── RunOwned                another owner holds a live lease on the run
        ├── CheckpointTooLarge (ValueError)  over the backend's size limit; nothing was sent
        ├── CorruptCheckpoint           stored bytes that are not a stepstone checkpoint
        ├── StoreUnavailable            cannot reach the store (network, throttling, locks)
        └── StorePermissionError (PermissionError)  credentials refused or missing

Backends translate their driver's exceptions into this tree in one place each,
always with ``raise ... from exc`` so the original stays on ``__cause__``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = [
    "safe_text",
    "CheckpointTooLarge",
    "ConfigError",
    "ConflictError",
    "CorruptCheckpoint",
    "DeadlineExceeded",
    "InputMismatch",
    "InvalidCharge",
    "InvalidRunId",
    "InvalidState",
    "InvalidWorkflow",
    "LeaseLost",
    "RunCancelled",
    "RunNotActive",
    "RunNotFound",
    "RunOwned",
    "ScheduleExists",
    "ScheduleNotFound",
    "StepFailed",
    "StepTimeout",
    "StepstoneError",
    "StoreError",
    "StorePermissionError",
    "StoreUnavailable",
    "Suspended",
    "WorkflowChanged",
]


class StepstoneError(Exception):
    """Base of every error stepstone raises."""


class ConfigError(StepstoneError, ValueError):
    """A store config string (or option) is malformed, unknown or needs a missing extra."""


class InvalidRunId(StepstoneError, ValueError):
    """A run_id outside what every backend accepts (1-1024 characters, no control characters)."""


class InvalidState(StepstoneError, TypeError):
    """A state that cannot round-trip through JSON; the message names the path of the value."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


class InvalidWorkflow(StepstoneError, TypeError, ValueError):
    """A ``Step``, ``RetryPolicy`` or list of steps that cannot be run as given."""


class WorkflowChanged(StepstoneError):
    """The completed steps recorded for a run differ from the steps passed now."""

    def __init__(self, message: str, run_id: str, position: int) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.position = position


class StepFailed(StepstoneError):
    """A step raised. The step's exception is ``__cause__``; ``state`` is the last checkpoint's."""

    def __init__(
        self,
        run_id: str,
        step_index: int,
        step_name: str,
        state: dict[str, Any],
        attempt: int = 1,
    ) -> None:
        super().__init__(
            f"run {run_id!r}: step {step_index} ({step_name!r}) failed on attempt {attempt}"
        )
        self.run_id = run_id
        self.step_index = step_index
        self.step_name = step_name
        self.state = state
        self.attempt = attempt


class InputMismatch(StepstoneError, ValueError):
    """A run was resumed or started again with an input other than the one it recorded."""

    def __init__(self, message: str, run_id: str, path: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.path = path


class InvalidCharge(StepstoneError, ValueError):
    """A charge or reservation that cannot be recorded; nothing was recorded (``_budget``)."""


class Suspended(StepstoneError):
    """The run waits for a signal, a timer or child runs; it is saved as ``waiting``.

    Not a failure: call ``run``/``arun`` again later, or let a worker resume it when
    what it waits for has happened. ``wake_at`` is None when only a signal can wake it.
    """

    def __init__(self, run_id: str, waiting_for: str, wake_at: datetime | None) -> None:
        when = "" if wake_at is None else f" (due {wake_at.isoformat()})"
        super().__init__(f"run {run_id!r} is waiting for {waiting_for}{when}")
        self.run_id = run_id
        self.waiting_for = waiting_for
        self.wake_at = wake_at


class RunCancelled(StepstoneError):
    """The run was cancelled (``stepstone.cancel``); it ran no step after that."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} was cancelled")
        self.run_id = run_id


class RunNotFound(StepstoneError, LookupError):
    """No run is stored under this run_id."""

    def __init__(self, message: str, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class RunNotActive(StepstoneError, ValueError):
    """The run is finished (``done`` or ``cancelled``) and cannot take what was asked."""

    def __init__(self, message: str, run_id: str, status: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.status = status


class HistoryNotKept(StepstoneError, ValueError):
    """The run keeps no history: not started with ``Workflow(history=True)``, or its store
    holds no pieces (Cosmos DB). ``history``, ``fork`` and ``rerun`` need one."""

    def __init__(self, message: str, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class StepNotKept(StepstoneError, ValueError):
    """``fork``/``rerun`` named a step the run's history holds no save for (or no step)."""

    def __init__(self, message: str, run_id: str, step: object) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.step = step


# --- time control (issue 33: ``_timeouts``, ``_deadline``, ``_schedule``) ---------


class StepTimeout(StepstoneError, TimeoutError):
    """A step ran past its ``timeout`` (or its ``idle_timeout`` without a heartbeat).

    Raised as the attempt's failure: the step's retry policy decides whether another
    attempt follows. Also raised by ``ctx.heartbeat()`` in an attempt that timed out.
    """


class DeadlineExceeded(StepstoneError):
    """The run reached its deadline; it failed (recorded), and its children were cancelled."""

    def __init__(self, run_id: str, deadline_at: datetime) -> None:
        super().__init__(
            f"run {run_id!r} reached its deadline of {deadline_at.isoformat()}; it ran out "
            "of time (see Workflow(deadline=) and start(..., deadline=))"
        )
        self.run_id = run_id
        self.deadline_at = deadline_at


class ScheduleExists(StepstoneError, ValueError):
    """A schedule of that name exists with another spec (pass ``replace=True``)."""


class ScheduleNotFound(StepstoneError, LookupError):
    """No schedule has that name."""


class StoreError(StepstoneError):
    """A store could not do what was asked."""


class ConflictError(StoreError):
    """Compare-and-swap lost: the stored version is not the one the save expected.

    Nothing was stored. Another worker owns the run; reload before trying again.
    """

    def __init__(self, message: str, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class LeaseLost(ConflictError):
    """Another owner took the run over (its lease had expired); the old owner stops.

    Raised to the old owner on its next save or renewal: nothing it tried to write was
    stored, and it must run no further step of that run.
    """


class RunOwned(ConflictError):
    """Another owner holds a live lease on the run: a second execution was refused."""

    def __init__(self, message: str, run_id: str, owner: str) -> None:
        super().__init__(message, run_id)
        self.owner = owner


class CheckpointTooLarge(StoreError, ValueError):
    """The encoded checkpoint is over the backend's limit; nothing was sent or stored."""

    def __init__(self, message: str, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class CorruptCheckpoint(StoreError):
    """Stored bytes that are not a readable stepstone checkpoint. They are left untouched."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or is throttling; ``status`` is the backend's code, if any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class StorePermissionError(StoreError, PermissionError):
    """The store refused the credentials, or none were found."""


def safe_text(error: BaseException, limit: int = 2000) -> str:
    """Return ``str(error)`` for a stored record: bounded, valid UTF-8, never raising.

    An exception's ``__str__`` is user code and may itself raise; the run must still end
    in ``StepFailed`` with its failure saved.
    """
    try:
        text = str(error)
    except Exception as exc:  # noqa: BLE001 - __str__ is user code, it may raise anything
        try:
            text = f"<{type(error).__qualname__}.__str__ raised {type(exc).__qualname__}>"
        except Exception:  # noqa: BLE001 - even the type's name may fail to print
            text = "<unprintable exception>"
    if not isinstance(text, str):
        text = "<__str__ returned a non-str>"
    return text[:limit].encode("utf-8", "backslashreplace").decode("utf-8")
