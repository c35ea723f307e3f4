"""An agent step's model and tool calls on the run's public journal (issue 31).

The adapters journal each durable unit of an agent run (a model request, a tool call)
as code workflows journal their calls: an entry ``{seq, call, attempt, at, result}``
appended to the list under ``JOURNAL_KEY`` in the run's own state, by the core's
compare-and-swap fenced by the run's lease (``_code_budget._append``), so a long state's
save stores the new entry alone. An adapter's entries also name their step (``"step"``:
a run of a step list may hold several agent steps); ``seq`` is unique in the run, so
``stepstone runs show``, ``journal``, ``fork`` and ``rerun`` at an entry, and the
stream's commit rule (an entry names the attempt whose events readers show) work as
for a code workflow's calls.

The agent runs beside the core, as a code workflow's function does (``_session``): a
task on the run's loop under ``arun``, a thread with a loop of its own under ``run``.
``UnitJournal`` is its side: it answers a unit from the entries already journaled (by
its call name, ``NAME#N``, N counting that name's encounters), and sends a new result
to the core as a ``save`` request, returning once the save landed. ``journaled`` is the
core's side, a loop of effects inside the step's ``evaluate``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine, Generator
from datetime import datetime
from typing import Any

from .._checkpoint import Checkpoint
from .._code_budget import _append
from .._effects import Call, Effect, Load
from .._errors import InvalidWorkflow, LeaseLost
from .._journal import JOURNAL_KEY, entry_ok, journal_of, json_value
from .._plan import Plan
from .._session import Session, Waiter, close
from .._store_time import Now
from .._write import _latest

__all__ = ["UnitJournal", "channel", "journaled", "step_entries", "with_journal"]

State = dict[str, Any]


def step_entries(cp: Checkpoint, step_name: str) -> list[dict[str, Any]]:
    """The journal entries of agent step ``step_name`` of run ``cp``, in the order saved."""
    return [
        entry
        for entry in journal_of(cp.state)
        if isinstance(entry, dict) and entry.get("step") == step_name
    ]


def _next_seq(cp: Checkpoint) -> int:
    seqs = [e["seq"] for e in journal_of(cp.state) if isinstance(e, dict) and "seq" in e]
    return max(seqs, default=-1) + 1


class UnitJournal:
    """The agent's side of one execution of an agent step: its entries and counters."""

    def __init__(self, cp: Checkpoint, step_name: str, link: Session, sync: bool) -> None:
        self.run_id = cp.run_id
        self.step_name = step_name
        self.link = link
        self.sync = sync
        recorded = step_entries(cp, step_name)
        #: Call name -> recorded result, for this step's entries that hold one.
        self.entries: dict[str, Any] = {e["call"]: e["result"] for e in recorded if "result" in e}
        self.seq = _next_seq(cp)
        self.counters: dict[str, int] = {}
        self.busy: str | None = None

    def next_name(self, name: str) -> str:
        """Return ``name`` with its encounter counter: ``NAME#1``, ``NAME#2``, ..."""
        count = self.counters.get(name, 0) + 1
        self.counters[name] = count
        return f"{name}#{count}"

    def take_seq(self) -> int:
        """Fix the position of the next unit (a unit's stream attempt is named by it)."""
        seq = self.seq
        self.seq += 1
        return seq

    async def ask(self, request: tuple[Any, ...]) -> Any:
        """Send ``request`` to the core and wait for its answer."""
        if self.sync:
            # The agent's loop is private to this step's thread: blocking it stalls nothing.
            return self.link.ask(request)
        return await self.link.aask(request)

    async def save(self, entries: list[dict[str, Any]]) -> None:
        """Append ``entries`` to the run's journal (one compare-and-swap, fenced)."""
        await self.ask(("save", entries))

    async def record(
        self, key: str, payload: Any, seq: int | None = None, stream: str | None = None
    ) -> Any:
        """Journal ``key: payload`` once; return what the journal holds for ``key``."""
        if key in self.entries:
            return self.entries[key]
        if seq is None:
            seq = self.take_seq()
        value = json_value(payload, self.run_id, key, seq)
        entry = entry_ok(seq, key, 1, value)
        entry["step"] = self.step_name
        if stream is not None:
            entry["stream"] = stream  # the attempt whose events readers show
        await self.save([entry])
        self.entries[key] = value
        return value

    async def latest_run(self) -> Checkpoint:
        """Return the run's record as stored now (its signals, its budget's ledger)."""
        cp: Checkpoint = await self.ask(("latest",))
        return cp

    async def store_now(self) -> datetime:
        """Return the time on the store's clock (``_store_time``), the one timers use:
        a wait's deadline set and judged by it ends neither early nor late on a host
        whose clock is off the store's."""
        now: datetime = await self.ask(("now",))
        return now


def channel(
    run_id: str, step_name: str, body: Callable[[], Coroutine[Any, Any, Any]], sync: bool
) -> Session:
    """The link between the core and ``body`` (the agent run): a code workflow's
    ``Session`` whose function is the agent run, run by ``asyncio.run`` in a thread of
    its own under ``run`` (``sync``), as a task on the run's loop under ``arun``."""

    def in_thread(ctx: object, input: State) -> Any:
        return asyncio.run(body())

    def as_task(ctx: object, input: State) -> Any:
        return body()

    fn = in_thread if sync else as_task
    return Session(run_id, step_name, {}, fn, {}, asynchronous=not sync)


def journaled(
    plan: Plan, cp: Checkpoint, state: State, link: Session, sync: bool
) -> Generator[Effect, Any, tuple[Checkpoint, Any]]:
    """Serve the agent's requests until it ends; return the run's record and its value.

    ``save``: append the entries by the core's write (fenced by the lease, re-based on
    signals), answered once landed; ``latest``: the run's record as stored now; ``now``:
    the store's time; ``end``: the agent run returned (its value is returned) or raised
    (raised here).
    """
    next_requests = link.next_requests if sync else link.anext_requests
    waiter = Waiter(link.name, next_requests, not sync)
    try:
        while True:
            batch = yield Call(waiter, state, None, cp)
            cp = _latest(plan, cp)  # renewed while the agent ran
            if inspect.isawaitable(batch):
                close(batch)  # never awaited: nothing of it ran
                raise InvalidWorkflow(
                    f"step {link.name!r}: stepstone.run (sync) was called from inside a "
                    "running event loop; there, use `await stepstone.arun(...)`"
                )
            for request in batch:
                kind = request[0]
                if kind == "end":
                    _, how, value = request
                    if how == "raise":
                        raise value
                    return cp, value
                reply = request[-1]
                if kind == "save":
                    cp = yield from _append(plan, cp, request[1], {})
                    link.answered(reply)
                    reply.ok(None)
                elif kind == "now":
                    now: datetime = yield Now()
                    link.answered(reply)
                    reply.ok(now)
                else:  # "latest"
                    fresh: Checkpoint | None = yield Load(plan.run_id)
                    link.answered(reply)
                    if fresh is None:
                        reply.fail(LeaseLost(f"run {plan.run_id!r} was deleted", plan.run_id))
                    else:
                        reply.ok(fresh)
    finally:
        link.stop("stopped")


def with_journal(state: State, cp: Checkpoint) -> None:
    """Put the journal as last saved into the state a step completes with."""
    if JOURNAL_KEY in cp.state:
        state[JOURNAL_KEY] = cp.state[JOURNAL_KEY]
