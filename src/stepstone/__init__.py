"""stepstone: durable execution for Python. Checkpoint every step, resume after a crash.

Where things live: the rules of a run in ``_core.py`` (a generator of the effects in
``_effects.py``, taking its lease in ``_acquire.py``, checked first by ``_checks.py``),
driven by ``run`` in ``_runner.py`` and ``arun`` in ``_arunner.py``; one execution's
``Plan`` in ``_plan.py``; steps, workflows and the base of suspending steps in
``_steps.py``; ``WaitFor``, ``Sleep`` and ``Map`` in ``_suspend.py``; leases in
``_lease.py``; start, cancel, retry and signal in ``_control.py``; moving runs onto a
newer workflow version in ``_upgrade.py``; a run's kept saves, ``fork`` and ``rerun`` in
``_history.py``;
the worker in the ``worker`` package; the Store contract in ``_store.py``; config strings in
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
    DeadlineExceeded,
    HistoryNotKept,
    InputMismatch,
    InvalidCharge,
    InvalidRunId,
    InvalidState,
    InvalidWorkflow,
    LeaseLost,
    RunCancelled,
    RunNotActive,
    RunNotFound,
    RunOwned,
    ScheduleExists,
    ScheduleNotFound,
    StepFailed,
    StepNotKept,
    StepstoneError,
    StepTimeout,
    StoreError,
    StorePermissionError,
    StoreUnavailable,
    Suspended,
    WorkflowChanged,
)

if TYPE_CHECKING:  # what the names below are, for type checkers; imported on first use
    from ._arunner import arun
    from ._budget import Budget, BudgetExhausted, Prices, Spend, spend_of
    from ._checkpoint import SCHEMA_VERSION, Checkpoint, Failure, RunStatus, Signal, check_run_id
    from ._code import (
        AsyncWorkflowContext,
        CallFailed,
        CodeWorkflow,
        WorkflowContext,
        current_call,
        workflow,
    )
    from ._code_history import JournalEntry, ajournal, journal
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
    from ._schedule import (
        ScheduleInfo,
        adelete_schedule,
        aschedule,
        aschedules,
        delete_schedule,
        pause_schedule,
        resume_schedule,
        schedule,
        schedules,
    )
    from ._schedule_fire import abackfill, backfill
    from ._steps import AttemptsExhausted, RetryPolicy, Step, StepContext, Workflow
    from ._store import Diagnosis, RunInfo, Store
    from ._stream import (
        EmitOutsideStep,
        EventTooLarge,
        StreamEvent,
        astream,
        delete_stream,
        emit,
        stream,
    )
    from ._suspend import ChildFailed, Map, Sleep, WaitFor, WaitTimeout
    from ._tenant import (
        TenantCap,
        TenantSpend,
        aset_tenant_cap,
        atenant_spend,
        set_tenant_cap,
        tenant_spend,
    )
    from ._upgrade import aupgrade, upgrade
    from .worker import Worker

# ``import stepstone`` imports only the error tree; every other public name is imported
# from its module the first time it is used (PEP 562), so a process that needs one
# backend, or the CLI's --help, does not pay for the runtime, the worker and the rest.
_LAZY: dict[str, str] = {
    "AsyncWorkflowContext": "._code",
    "AttemptsExhausted": "._steps",
    "Budget": "._budget",
    "BudgetExhausted": "._budget",
    "CallFailed": "._code",
    "Checkpoint": "._checkpoint",
    "ChildFailed": "._suspend",
    "CodeWorkflow": "._code",
    "DEFAULT_LEASE": "._lease",
    "DEFAULT_STORE": "._registry",
    "Diagnosis": "._store",
    "EmitOutsideStep": "._stream",
    "EventTooLarge": "._stream",
    "Failure": "._checkpoint",
    "HistoryEntry": "._history",
    "JournalEntry": "._code_history",
    "Limit": "._flow",
    "LimitReached": "._flow",
    "LimitUsage": "._flow",
    "Map": "._suspend",
    "Prices": "._budget",
    "RateLimited": "._flow",
    "RetryPolicy": "._steps",
    "RunInfo": "._store",
    "RunStatus": "._checkpoint",
    "SCHEMA_VERSION": "._checkpoint",
    "ScheduleInfo": "._schedule",
    "Signal": "._checkpoint",
    "Sleep": "._suspend",
    "Spend": "._budget",
    "TenantCap": "._tenant",
    "TenantSpend": "._tenant",
    "aset_tenant_cap": "._tenant",
    "atenant_spend": "._tenant",
    "set_tenant_cap": "._tenant",
    "tenant_spend": "._tenant",
    "Step": "._steps",
    "StepContext": "._steps",
    "Store": "._store",
    "StreamEvent": "._stream",
    "WaitFor": "._suspend",
    "WaitTimeout": "._suspend",
    "Worker": ".worker",
    "Workflow": "._steps",
    "WorkflowContext": "._code",
    "abackfill": "._schedule_fire",
    "acancel": "._control",
    "adelete_schedule": "._schedule",
    "afork": "._history",
    "aget_limit": "._flow",
    "ahistory": "._history",
    "ajournal": "._code_history",
    "alimit_usage": "._flow",
    "alist_limits": "._flow",
    "arerun": "._history",
    "aretry": "._control",
    "arun": "._arunner",
    "aschedule": "._schedule",
    "aschedules": "._schedule",
    "aset_limit": "._flow",
    "astream": "._stream",
    "asignal": "._control",
    "astart": "._control",
    "aupgrade": "._upgrade",
    "backfill": "._schedule_fire",
    "cancel": "._control",
    "check_run_id": "._checkpoint",
    "current_call": "._code",
    "delete_stream": "._stream",
    "emit": "._stream",
    "delete_schedule": "._schedule",
    "fork": "._history",
    "get_limit": "._flow",
    "history": "._history",
    "journal": "._code_history",
    "limit_usage": "._flow",
    "list_limits": "._flow",
    "open_store": "._registry",
    "pause_schedule": "._schedule",
    "register_store": "._registry",
    "rerun": "._history",
    "resume_schedule": "._schedule",
    "retry": "._control",
    "run": "._runner",
    "schedule": "._schedule",
    "schedules": "._schedule",
    "schemes": "._registry",
    "set_limit": "._flow",
    "signal": "._control",
    "spend_of": "._budget",
    "start": "._control",
    "stream": "._stream",
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
    "Budget",
    "BudgetExhausted",
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
    "DeadlineExceeded",
    "Diagnosis",
    "EmitOutsideStep",
    "EventTooLarge",
    "Failure",
    "HistoryEntry",
    "HistoryNotKept",
    "InputMismatch",
    "InvalidCharge",
    "InvalidRunId",
    "InvalidState",
    "InvalidWorkflow",
    "JournalEntry",
    "LeaseLost",
    "Limit",
    "LimitReached",
    "LimitUsage",
    "Map",
    "Prices",
    "RateLimited",
    "RetryPolicy",
    "RunCancelled",
    "RunInfo",
    "RunNotActive",
    "RunNotFound",
    "RunOwned",
    "RunStatus",
    "SCHEMA_VERSION",
    "ScheduleExists",
    "ScheduleInfo",
    "ScheduleNotFound",
    "Signal",
    "Sleep",
    "Spend",
    "Step",
    "StepContext",
    "StepFailed",
    "StepNotKept",
    "StepTimeout",
    "StepstoneError",
    "Store",
    "StoreError",
    "StorePermissionError",
    "StoreUnavailable",
    "StreamEvent",
    "Suspended",
    "TenantCap",
    "TenantSpend",
    "WaitFor",
    "WaitTimeout",
    "Worker",
    "Workflow",
    "WorkflowChanged",
    "WorkflowContext",
    "abackfill",
    "acancel",
    "adelete_schedule",
    "afork",
    "aget_limit",
    "ahistory",
    "ajournal",
    "alimit_usage",
    "alist_limits",
    "arerun",
    "aretry",
    "arun",
    "aschedule",
    "aschedules",
    "aset_limit",
    "aset_tenant_cap",
    "asignal",
    "astart",
    "astream",
    "atenant_spend",
    "aupgrade",
    "backfill",
    "cancel",
    "check_run_id",
    "current_call",
    "delete_stream",
    "emit",
    "delete_schedule",
    "fork",
    "get_limit",
    "history",
    "journal",
    "limit_usage",
    "list_limits",
    "open_store",
    "pause_schedule",
    "register_store",
    "rerun",
    "resume_schedule",
    "retry",
    "run",
    "schedule",
    "schedules",
    "schemes",
    "set_limit",
    "set_tenant_cap",
    "signal",
    "spend_of",
    "start",
    "stream",
    "tenant_spend",
    "upgrade",
    "workflow",
]
__version__ = "0.1.0"
