"""stepstone: durable execution for Python. Checkpoint every step, resume after a crash.

Where things live: the runner in ``_runner.py``, the Store contract in ``_store.py``,
config strings in ``_registry.py``, errors in ``_errors.py``, each backend in
``stores/``, the contract suite in ``testing/``, the command line in ``cli.py``.
"""

from ._checkpoint import SCHEMA_VERSION, Checkpoint, Failure, RunStatus, check_run_id
from ._errors import (
    CheckpointTooLarge,
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    InvalidRunId,
    InvalidState,
    InvalidWorkflow,
    StepFailed,
    StepstoneError,
    StoreError,
    StorePermissionError,
    StoreUnavailable,
    WorkflowChanged,
)
from ._registry import DEFAULT_STORE, open_store, register_store, schemes
from ._runner import AttemptsExhausted, RetryPolicy, Step, StepContext, run
from ._store import Diagnosis, RunInfo, Store

__all__ = [
    "DEFAULT_STORE",
    "SCHEMA_VERSION",
    "AttemptsExhausted",
    "Checkpoint",
    "Diagnosis",
    "CheckpointTooLarge",
    "ConfigError",
    "ConflictError",
    "CorruptCheckpoint",
    "Failure",
    "InvalidRunId",
    "InvalidState",
    "InvalidWorkflow",
    "RetryPolicy",
    "RunInfo",
    "RunStatus",
    "Step",
    "StepContext",
    "StepFailed",
    "StepstoneError",
    "Store",
    "StoreError",
    "StorePermissionError",
    "StoreUnavailable",
    "WorkflowChanged",
    "check_run_id",
    "open_store",
    "register_store",
    "run",
    "schemes",
]
__version__ = "0.1.0"
