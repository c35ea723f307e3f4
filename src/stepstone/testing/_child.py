"""A child process for crash tests: runs a workflow and dies where it is told to.

Run as ``python -m stepstone.testing._child SPEC_JSON``. SPEC keys:

- ``config``: store config string; ``run_id``; ``steps``: list of step names.
- ``effects``: a file each step appends ``name attempt`` to (fsynced) before returning,
  so the parent can count how often each step's side effect happened.
- ``kill`` (optional): ``{"how": "exit" | "sigkill", "step": NAME, "at": WHERE}`` where
  WHERE is ``"inside"`` (the step dies after its side effect, before returning) or a hook
  point (see ``stepstone._hooks``) reached after ``step`` returned, e.g.
  ``"runner.after_step"`` or ``"file.after_temp_write"``.
- ``fail`` (optional): ``{NAME: n}`` makes the step raise on its first ``n`` attempts.
- ``retry`` (optional): ``{NAME: max_attempts}`` gives the step a retry policy (no delay).
- ``mode`` (optional): ``"sync"`` (default) runs plain steps with ``run``; ``"async"``
  runs ``async def`` steps with ``arun`` on one event loop, so the kill lands inside
  ``arun`` (in the loop thread, or in the thread where the store's async save runs).

On success the final state is printed as JSON; a ``StepFailed`` exits with status 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from .. import _hooks
from .._errors import StepFailed
from .._registry import open_store
from .._runner import RetryPolicy, Step, StepContext
from .._store import Store

EXIT_CODE = 3


def _die(how: str) -> None:
    sys.stdout.flush()
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(EXIT_CODE)


def _record(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    """Run the workflow SPEC describes; return the exit status."""
    spec: dict[str, Any] = json.loads(argv[0])
    kill: dict[str, str] | None = spec.get("kill")
    fail: dict[str, int] = spec.get("fail", {})
    retry: dict[str, int] = spec.get("retry", {})
    current: dict[str, str | None] = {"step": None}
    armed = {"on": False}

    if kill is not None and kill["at"] != "inside":

        def hook(point: str) -> None:
            if current["step"] != kill["step"]:
                return
            if point == "runner.after_step":
                armed["on"] = True  # the step returned: its save comes next
            # Runner points count whenever the step is current; a store's points only
            # inside the save of that step's checkpoint.
            if point == kill["at"] and (armed["on"] or point.startswith("runner.")):
                _die(kill["how"])

        _hooks.install(hook)

    def make(index: int, name: str) -> Step:
        def fn(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
            current["step"] = name
            _record(spec["effects"], f"{name} {ctx.attempt}")
            if kill is not None and kill["at"] == "inside" and kill["step"] == name:
                _die(kill["how"])
            if ctx.attempt <= fail.get(name, 0):
                raise RuntimeError(f"{name} fails on attempt {ctx.attempt}")
            return {name: index + 1, "last": name}

        async def afn(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
            await asyncio.sleep(0)
            return fn(state, ctx)

        policy = None
        if name in retry:
            policy = RetryPolicy(max_attempts=retry[name], initial_delay=0.0, jitter=0.0)
        return Step(name, afn if spec.get("mode") == "async" else fn, retry=policy)

    steps = [make(i, name) for i, name in enumerate(spec["steps"])]
    store = open_store(spec["config"])
    try:
        final = _run(spec.get("mode", "sync"), spec["run_id"], steps, store)
    except StepFailed as exc:
        print(json.dumps({"failed": exc.step_name, "attempt": exc.attempt}))
        return 1
    print(json.dumps(final, sort_keys=True))
    return 0


def _run(mode: str, run_id: str, steps: list[Step], store: Store) -> dict[str, Any]:
    if mode == "sync":
        from .._runner import run  # noqa: PLC0415

        with store:
            return run(run_id, steps, store)
    from .._runner import arun  # noqa: PLC0415

    async def main() -> dict[str, Any]:
        async with store:
            return await arun(run_id, steps, store)

    return asyncio.run(main())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
