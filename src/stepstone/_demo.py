"""``stepstone demo``: watch a run survive a real crash.

The parent starts the workflow in a child process; its second step kills that process
with SIGKILL on the first attempt (the parent sets ``STEPSTONE_DEMO_CRASH`` to the run id
for the first child only). The parent then starts a fresh child on the same run id,
which skips the checkpointed step and finishes the rest.

Children talk to the parent in JSON lines on stdout; the parent tells the story.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

from ._errors import safe_text
from ._registry import ENV_VAR, open_store
from ._runner import Step, StepContext, run

__all__ = ["STEP_NAMES", "approval_workflows", "new_run_id", "run_approval_demo", "run_demo"]

CRASH_ENV = "STEPSTONE_DEMO_CRASH"
#: The workflow's steps; the second one crashes its process on the first attempt.
STEP_NAMES = ("fetch_order", "reserve_stock", "charge_card", "send_receipt")
_CRASH_STEP = STEP_NAMES[1]
_WIDTH = max(len(name) for name in STEP_NAMES) + 2

Emit = Callable[..., None]


# --- the child: runs the workflow -------------------------------------------------------


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def _steps(run_id: str, emit: Emit) -> list[Step]:
    pid = os.getpid()

    def ran(state: dict[str, Any], name: str) -> dict[str, int]:
        return {**state.get("ran_in_pid", {}), name: pid}

    def fetch_order(state: dict[str, Any]) -> dict[str, Any]:
        emit("start", step="fetch_order")
        return {
            "order": {"id": "A-1001", "items": ["lamp", "book"], "total": 42.5},
            "ran_in_pid": ran(state, "fetch_order"),
        }

    def reserve_stock(state: dict[str, Any]) -> dict[str, Any]:
        emit("start", step="reserve_stock")
        if os.environ.get(CRASH_ENV) == run_id:
            emit("crash", step="reserve_stock")
            sig = getattr(signal, "SIGKILL", signal.SIGTERM)
            os.kill(os.getpid(), sig)
        return {
            "reserved": list(state["order"]["items"]),
            "ran_in_pid": ran(state, "reserve_stock"),
        }

    def charge_card(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        emit("start", step="charge_card")
        # A real payment API gets the idempotency key, so a repeated call is a no-op.
        return {
            "payment": f"pay-{ctx.idempotency_key[:12]}",
            "ran_in_pid": ran(state, "charge_card"),
        }

    def send_receipt(state: dict[str, Any]) -> dict[str, Any]:
        emit("start", step="send_receipt")
        return {"receipt": "sent", "ran_in_pid": ran(state, "send_receipt")}

    return [
        Step("fetch_order", fetch_order),
        Step("reserve_stock", reserve_stock),
        Step("charge_card", charge_card),
        Step("send_receipt", send_receipt),
    ]


#: Seconds: the lease the demo's processes take on the run.
DEMO_LEASE = 2.0


def _child(run_id: str) -> int:
    """Run the demo workflow once; the store comes from ``STEPSTONE_STORE``."""
    try:
        with open_store() as store:
            before = store.load(run_id)
            done = before.step + 1 if before is not None else 0
            for name in STEP_NAMES[:done]:
                _emit("skip", step=name)
            completed: list[str] = []

            def emit(event: str, **fields: Any) -> None:
                # A step starting means the one before it was checkpointed.
                if event == "start" and completed:
                    _emit("saved", step=completed[-1])
                if event == "start":
                    completed.append(fields["step"])
                _emit(event, **fields)

            # A short lease: the resumed process waits for the killed one's lease to
            # expire before it takes the run over, and the demo should not idle 30 s.
            state = run(run_id, _steps(run_id, emit), store, lease=DEMO_LEASE)
            if completed:
                _emit("saved", step=completed[-1])
            _emit("finished", state=state)
    except Exception as exc:  # noqa: BLE001 - the demo child reports any failure to its parent
        _emit("error", message=f"{type(exc).__name__}: {safe_text(exc)}")
        return 1
    return 0


# --- the parent: starts children and tells the story -------------------------------------


def new_run_id() -> str:
    """Return a fresh run id, so the demo can be run again in the same store."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"demo-{stamp}-{secrets.token_hex(2)}"


class _Child:
    """What one child process did, from its event lines."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.skipped: list[str] = []
        self.crashed_in: str | None = None
        self.state: dict[str, Any] | None = None
        self.error: str | None = None
        self.pid = 0
        self.returncode = 0


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (exit status {returncode})"
    return f"exit status {returncode}"


def _start_child(run_id: str, store_url: str, crash: bool, out: TextIO, verbose: bool) -> _Child:
    env = dict(os.environ)
    # The store goes by environment, not argv: argv is visible to every user in `ps`.
    env[ENV_VAR] = store_url
    env.pop(CRASH_ENV, None)
    if crash:
        env[CRASH_ENV] = run_id
    child = _Child()
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stepstone._demo", run_id],
            stdout=subprocess.PIPE,
            stderr=None if verbose else errors,
            env=env,
            text=True,
        )
        child.pid = proc.pid
        out.write(f"   (child process pid {proc.pid})\n")
        out.flush()
        assert proc.stdout is not None
        for line in proc.stdout:
            _on_event(line, child, out)
        child.returncode = proc.wait()
        if child.returncode > 0 and child.error is None:
            errors.seek(0)
            lines = [ln for ln in errors.read().splitlines() if ln.strip()]
            child.error = lines[-1] if lines else _describe_exit(child.returncode)
    return child


def _on_event(line: str, child: _Child, out: TextIO) -> None:
    try:
        event: dict[str, Any] = json.loads(line)
    except ValueError:
        out.write(f"   | {line.rstrip()}\n")
        return
    kind = event.get("event")
    step = str(event.get("step", ""))
    if kind == "skip":
        child.skipped.append(step)
        out.write(f"   step {step!r:<{_WIDTH}} SKIPPED  (already done: its checkpoint is saved)\n")
    elif kind == "start":
        child.ran.append(step)
        out.write(f"   step {step!r:<{_WIDTH}} running...\n")
    elif kind == "saved":
        out.write(f"   step {step!r:<{_WIDTH}} done, checkpoint saved\n")
    elif kind == "crash":
        child.crashed_in = step
        out.write(
            f"   step {step!r:<{_WIDTH}} CRASH: the process kills itself with SIGKILL "
            "(like a power cut or an OOM kill)\n"
        )
    elif kind == "finished":
        child.state = event.get("state")
    elif kind == "error":
        child.error = str(event.get("message"))
    out.flush()


def run_demo(
    store_url: str,
    out: TextIO,
    *,
    shown_store: str | None = None,
    store_option: str = "",
    run_id: str | None = None,
    verbose: bool = False,
    command: str = "stepstone",
    report: dict[str, Any] | None = None,
) -> int:
    """Run the crash-and-resume demo against ``store_url``; return the exit status.

    Args:
        store_url: The store, shared by the two child processes.
        out: Where the narrative goes.
        shown_store: ``store_url`` as it may be printed (secrets masked).
        store_option: The ``--store ...`` text for the closing hint, if one was given.
        run_id: The run id to use; a new one by default.
        verbose: Let the children log at DEBUG.
        command: How this machine runs the ``stepstone`` command (``.venv/bin/stepstone``
            when it is not on PATH), for the closing hint.
        report: Filled with what happened (run id, pids, steps ran and skipped, final
            state), for ``stepstone demo --json``.

    Raises:
        RuntimeError: a child process failed in a way the demo did not plan; the message
            says how.
    """
    run_id = run_id or new_run_id()
    shown = shown_store or store_url
    w = out.write
    w("stepstone demo: a workflow that survives its process being killed\n\n")
    w(f"store:    {shown}\n")
    w(f"run id:   {run_id}\n")
    w(f"workflow: {' -> '.join(STEP_NAMES)}\n")
    w("Each finished step saves a checkpoint; re-running the same run id resumes after it.\n\n")

    w("1) Start the run in a child process. It will be killed during step 2.\n")
    first = _start_child(run_id, store_url, True, out, verbose)
    if first.returncode == 0 or first.crashed_in is None:
        detail = first.error or _describe_exit(first.returncode)
        raise RuntimeError(f"demo: the first child process was meant to crash, but: {detail}")
    w(f"   => the child process died: {_describe_exit(first.returncode)}\n")
    with open_store(store_url) as store:
        cp = store.load(run_id)
    if cp is None:
        w("   => nothing was saved for the run\n\n")
    else:
        saved = ", ".join(repr(n) for n in cp.step_names) or "none"
        w(
            f"   => what survived in the store: {cp.step + 1} of {cp.total_steps} steps "
            f"done ({saved})\n\n"
        )

    w(
        "2) Run the same run id again in a fresh process. It takes the run over once the "
        f"dead\n   process's lease ({DEMO_LEASE:g} s) has gone unrenewed.\n"
    )
    second = _start_child(run_id, store_url, False, out, verbose)
    if second.returncode != 0 or second.state is None:
        detail = second.error or _describe_exit(second.returncode)
        raise RuntimeError(f"demo: resuming the run failed: {detail}")
    w("   => the run finished\n\n")

    def names(items: list[str]) -> str:
        return ", ".join(repr(n) for n in items) or "none"

    completed_first = [n for n in first.ran if n != first.crashed_in]
    w("Summary\n")
    w(
        f"   first process (pid {first.pid}):  completed {names(completed_first)}, "
        f"then was killed during {first.crashed_in!r}\n"
    )
    w(
        f"   second process (pid {second.pid}): skipped {names(second.skipped)} "
        f"(from the checkpoint), ran {names(second.ran)}\n"
    )
    w(
        f"   {first.crashed_in!r} ran twice: its first attempt died before its checkpoint "
        "was saved.\n   Steps run at least once, so make them idempotent "
        "(StepContext.idempotency_key helps).\n"
    )
    w("   final state:\n")
    for line in json.dumps(second.state, indent=2, ensure_ascii=False).splitlines():
        w(f"     {line}\n")
    w(f"\nInspect the run:  {command} runs show {run_id}{store_option}\n")
    out.flush()
    if report is not None:
        report.update(
            run_id=run_id,
            store=shown,
            status="done",
            first={
                "pid": first.pid,
                "completed": completed_first,
                "killed_during": first.crashed_in,
            },
            second={"pid": second.pid, "skipped": list(second.skipped), "ran": list(second.ran)},
            state=second.state,
            inspect=f"{command} runs show {run_id}{store_option}",
        )
    return 0


# --- stepstone demo --approval: a run that waits for a person --------------------------

APPROVAL_SIGNAL = "approval"


def _draft(state: dict[str, Any]) -> dict[str, Any]:
    return {"draft": "Dear Ana, your refund of 42.50 EUR is on its way."}


def _send(state: dict[str, Any]) -> dict[str, Any]:
    approval = state.get("approval") or {}
    if not (isinstance(approval, dict) and approval.get("ok")):
        return {"sent": False, "reason": "not approved"}
    return {"sent": True}


def approval_workflows() -> list[Any]:
    """Return the approval demo's workflow, for ``stepstone worker --workflows
    stepstone._demo:approval_workflows`` (a worker calls nothing: see ``WORKFLOWS``)."""
    import stepstone  # noqa: PLC0415  (the runtime API, imported when used)

    steps = [
        Step("draft_reply", _draft),
        stepstone.WaitFor("approval", APPROVAL_SIGNAL),
        Step("send_reply", _send),
    ]
    return [stepstone.Workflow("approval-demo", steps)]


def _declined(state: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("card declined by the issuer (demo)")


def _leave_failed_run(store: Any) -> str:
    """Leave a failed run beside the waiting one, for ``stepstone ui`` to show."""
    import stepstone  # noqa: PLC0415

    run_id = "payment-" + new_run_id().removeprefix("demo-")
    # The failure is the point here: keep its error log line out of the demo's story.
    log = logging.getLogger("stepstone")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with contextlib.suppress(stepstone.StepFailed):
            run(run_id, [Step("charge_card", _declined)], store)
    finally:
        log.setLevel(level)
    return run_id


def run_approval_demo(
    store_url: str,
    out: TextIO,
    *,
    shown_store: str | None = None,
    store_option: str = "",
    command: str = "stepstone",
    manual: bool = False,
    report: dict[str, Any] | None = None,
) -> int:
    """Draft a reply, wait for a person's approval (a signal), then send it.

    The run suspends with status ``waiting``; nothing runs while it waits. Without
    ``manual`` the demo then sends the approval itself, as ``stepstone runs signal``
    would, and resumes the run; with ``manual`` it stops there and prints the commands.
    """
    import stepstone  # noqa: PLC0415

    (workflow,) = approval_workflows()
    run_id = "approval-" + new_run_id().removeprefix("demo-")
    w = out.write
    signal_command = (
        f"{command} runs signal {run_id} {APPROVAL_SIGNAL} --data '{{\"ok\": true}}'{store_option}"
    )
    w("stepstone demo --approval: a run that waits for a person\n\n")
    w(f"store:    {shown_store or store_url}\nrun id:   {run_id}\n")
    w("workflow: draft_reply -> WaitFor('approval') -> send_reply\n\n")
    with open_store(store_url) as store:
        w("1) Run it: the draft is saved, then the run suspends.\n")
        try:
            run(run_id, workflow, store)
        except stepstone.Suspended as exc:
            w(f"   => status waiting, waiting for: {exc.waiting_for}\n")
        else:
            raise RuntimeError("demo: the run was meant to wait for its approval")
        if manual:
            failed_id = _leave_failed_run(store)
            w(f"   and a run that failed, for the dashboard: {failed_id}\n")
            w(f"\nApprove it:   {signal_command}\n")
            w(
                f"Then resume:  {command} worker --workflows "
                f"stepstone._demo:WORKFLOWS{store_option}   (Ctrl-C when it is done)\n"
                f"Or look:      {command} runs show {run_id}{store_option}\n"
                f"Or see both:  {command} ui{store_option}   (then open http://127.0.0.1:8080/)\n"
            )
            if report is not None:
                report.update(
                    run_id=run_id,
                    status="waiting",
                    signal=signal_command,
                    failed_run_id=failed_id,
                    ui=f"{command} ui{store_option}",
                )
            return 0
        w(
            "\n2) A person approves it; the demo does what this command does:\n"
            f"   {signal_command}\n"
        )
        stepstone.signal(store, run_id, APPROVAL_SIGNAL, {"ok": True}, signal_id="demo")
        w("3) Run it again: the approval is merged, the reply sent.\n")
        state = run(run_id, workflow, store)
    w(f"   => done; sent: {state.get('sent')}\n")
    w(f"\nInspect the run:  {command} runs show {run_id}{store_option}\n")
    if report is not None:
        report.update(run_id=run_id, status="done", state=state, signal=signal_command)
    return 0


def __getattr__(name: str) -> Any:
    # ``WORKFLOWS`` is built on first use: the runtime API is imported lazily.
    if name == "WORKFLOWS":
        return approval_workflows()
    raise AttributeError(name)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m stepstone._demo RUN_ID  (started by 'stepstone demo')")
        sys.exit(2)
    sys.exit(_child(sys.argv[1]))
