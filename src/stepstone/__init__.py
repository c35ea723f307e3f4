"""stepstone: durable execution for Python. Checkpoint every step, resume after a crash.

Where things live: the rules of a run in ``_core.py`` (a generator of the effects in
``_effects.py``, taking its lease in ``_acquire.py``, checked first by ``_checks.py``),
driven by ``run`` in ``_runner.py`` and ``arun`` in ``_arunner.py``; one execution's
``Plan`` in ``_plan.py``; steps, workflows and the base of suspending steps in
``_steps.py``; ``WaitFor``, ``Sleep`` and ``Map`` in ``_suspend.py``; leases in
``_lease.py``; start, cancel, retry and signal in ``_control.py``; moving runs onto a
newer workflow version in ``_upgrade.py``; a run's kept saves, ``fork`` and ``rerun`` in
``_history.py``;
the worker in ``_worker.py``; the Store contract in ``_store.py``; config strings in
``_registry.py``; errors in ``_errors.py``; each backend in ``stores/``; the contract
suite in ``testing/``; the command line in ``cli``.
"""

import importlib
from typing import TYPE_CHECKING

from ._errors import (
    CheckpointTooLarge,
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    HistoryNotKept,
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
    StepNotKept,
    StepstoneError,
    StoreError,
    StorePermissionError,
    StoreUnavailable,
    Suspended,
    WorkflowChanged,
)

if TYPE_CHECKING:  # what the names below are, for type checkers; imported on first use
    from ._arunner import arun
    from ._checkpoint import SCHEMA_VERSION, Checkpoint, Failure, RunStatus, Signal, check_run_id
    from ._code import (
        AsyncWorkflowContext,
        CallFailed,
        CodeWorkflow,
        WorkflowContext,
        current_call,
        workflow,
    )
    from ._control import acancel, aretry, asignal, astart, cancel, retry, signal, start
    from ._flow import (
        Limit,
        LimitReached,
        LimitUsage,
        RateLimited,
        aget_limit,
        alimit_usage,
        alist_limits,
        aset_limit,
        get_limit,
        limit_usage,
        list_limits,
        set_limit,
    )
    from ._history import HistoryEntry, afork, ahistory, arerun, fork, history, rerun
    from ._lease import DEFAULT_LEASE
    from ._registry import DEFAULT_STORE, open_store, register_store, schemes
    from ._runner import run
    from ._steps import AttemptsExhausted, RetryPolicy, Step, StepContext, Workflow
    from ._store import Diagnosis, RunInfo, Store
    from ._suspend import ChildFailed, Map, Sleep, WaitFor, WaitTimeout
    from ._upgrade import aupgrade, upgrade
    from ._worker import Worker

# ``import stepstone`` imports only the error tree; every other public name is imported
# from its module the first time it is used (PEP 562), so a process that needs one
# backend, or the CLI's --help, does not pay for the runtime, the worker and the rest.
_LAZY: dict[str, str] = {
    "AsyncWorkflowContext": "._code",
    "AttemptsExhausted": "._steps",
    "CallFailed": "._code",
    "Checkpoint": "._checkpoint",
    "ChildFailed": "._suspend",
    "CodeWorkflow": "._code",
    "DEFAULT_LEASE": "._lease",
    "DEFAULT_STORE": "._registry",
    "Diagnosis": "._store",
    "Failure": "._checkpoint",
    "HistoryEntry": "._history",
    "Limit": "._flow",
    "LimitReached": "._flow",
    "LimitUsage": "._flow",
    "Map": "._suspend",
    "RateLimited": "._flow",
    "RetryPolicy": "._steps",
    "RunInfo": "._store",
    "RunStatus": "._checkpoint",
    "SCHEMA_VERSION": "._checkpoint",
    "Signal": "._checkpoint",
    "Sleep": "._suspend",
    "Step": "._steps",
    "StepContext": "._steps",
    "Store": "._store",
    "WaitFor": "._suspend",
    "WaitTimeout": "._suspend",
    "Worker": "._worker",
    "Workflow": "._steps",
    "WorkflowContext": "._code",
    "acancel": "._control",
    "afork": "._history",
    "aget_limit": "._flow",
    "ahistory": "._history",
    "alimit_usage": "._flow",
    "alist_limits": "._flow",
    "arerun": "._history",
    "aretry": "._control",
    "arun": "._arunner",
    "aset_limit": "._flow",
    "asignal": "._control",
    "astart": "._control",
    "aupgrade": "._upgrade",
    "cancel": "._control",
    "check_run_id": "._checkpoint",
    "current_call": "._code",
    "fork": "._history",
    "get_limit": "._flow",
    "history": "._history",
    "limit_usage": "._flow",
    "list_limits": "._flow",
    "open_store": "._registry",
    "register_store": "._registry",
    "rerun": "._history",
    "retry": "._control",
    "run": "._runner",
    "schemes": "._registry",
    "set_limit": "._flow",
    "signal": "._control",
    "start": "._control",
    "upgrade": "._upgrade",
    "workflow": "._code",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stepstone' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AsyncWorkflowContext",
    "AttemptsExhausted",
    "CallFailed",
    "Checkpoint",
    "CheckpointTooLarge",
    "ChildFailed",
    "CodeWorkflow",
    "ConfigError",
    "ConflictError",
    "CorruptCheckpoint",
    "DEFAULT_LEASE",
    "DEFAULT_STORE",
    "Diagnosis",
    "Failure",
    "HistoryEntry",
    "HistoryNotKept",
    "InputMismatch",
    "InvalidRunId",
    "InvalidState",
    "InvalidWorkflow",
    "LeaseLost",
    "Limit",
    "LimitReached",
    "LimitUsage",
    "Map",
    "RateLimited",
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
    "StepNotKept",
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
    "WorkflowContext",
    "acancel",
    "afork",
    "aget_limit",
    "ahistory",
    "alimit_usage",
    "alist_limits",
    "arerun",
    "aretry",
    "arun",
    "aset_limit",
    "asignal",
    "astart",
    "aupgrade",
    "cancel",
    "check_run_id",
    "current_call",
    "fork",
    "get_limit",
    "history",
    "limit_usage",
    "list_limits",
    "open_store",
    "register_store",
    "rerun",
    "retry",
    "run",
    "schemes",
    "set_limit",
    "signal",
    "start",
    "upgrade",
    "workflow",
]
__version__ = "0.1.0"
