"""stepstone: durable execution for Python. Checkpoint every step, resume after a crash.

Where things live: the runner in ``_runner.py`` (``run``, ``arun``) driving the rules
in ``_core.py``; steps and workflows in ``_steps.py``; suspending steps in
``_suspend.py``; leases in ``_lease.py``; start, cancel and signal in ``_control.py``;
the worker in ``_worker.py``; the Store contract in ``_store.py``; config strings in
``_registry.py``; errors in ``_errors.py``; each backend in ``stores/``; the contract
suite in ``testing/``; the command line in ``cli``.
"""

from ._checkpoint import SCHEMA_VERSION, Checkpoint, Failure, RunStatus, Signal, check_run_id
from ._control import acancel, asignal, astart, cancel, signal, start
from ._errors import (
    CheckpointTooLarge,
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    InputMismatch,
    InvalidRunId,
    InvalidState,
    InvalidWorkflow,
    LeaseLost,
    RunCancelled,
    RunNotActive,
    RunNotFound,
    RunOwned,
    StepFailed,
    StepstoneError,
    StoreError,
    StorePermissionError,
    StoreUnavailable,
    Suspended,
    WorkflowChanged,
)
from ._lease import DEFAULT_LEASE
from ._registry import DEFAULT_STORE, open_store, register_store, schemes
from ._runner import arun, run
from ._steps import AttemptsExhausted, RetryPolicy, Step, StepContext, Workflow
from ._store import Diagnosis, RunInfo, Store
from ._suspend import ChildFailed, Map, Sleep, WaitFor, WaitTimeout
from ._worker import Worker

__all__ = [
    "AttemptsExhausted",
    "Checkpoint",
    "CheckpointTooLarge",
    "ChildFailed",
    "ConfigError",
    "ConflictError",
    "CorruptCheckpoint",
    "DEFAULT_LEASE",
    "DEFAULT_STORE",
    "Diagnosis",
    "Failure",
    "InputMismatch",
    "InvalidRunId",
    "InvalidState",
    "InvalidWorkflow",
    "LeaseLost",
    "Map",
    "RetryPolicy",
    "RunCancelled",
    "RunInfo",
    "RunNotActive",
    "RunNotFound",
    "RunOwned",
    "RunStatus",
    "SCHEMA_VERSION",
    "Signal",
    "Sleep",
    "Step",
    "StepContext",
    "StepFailed",
    "StepstoneError",
    "Store",
    "StoreError",
    "StorePermissionError",
    "StoreUnavailable",
    "Suspended",
    "WaitFor",
    "WaitTimeout",
    "Worker",
    "Workflow",
    "WorkflowChanged",
    "acancel",
    "arun",
    "asignal",
    "astart",
    "cancel",
    "check_run_id",
    "open_store",
    "register_store",
    "run",
    "schemes",
    "signal",
    "start",
]
__version__ = "0.1.0"
