"""The LangGraph saver's automatic spend charges: its AI messages' usage, on its thread.

``StepstoneSaver(store, budget=Budget(...), prices=Prices(...))``: every ``put`` in a
thread's root namespace charges the usage of the AI messages new in that checkpoint's
updated channels (``usage_metadata``: input and output tokens; dollars through
``prices``). The ledger is the one runs keep (``stepstone._budget``), under ``~spend`` in
the namespace's head record, so:

- exact across crashes: the charge is part of the head's save, the compare-and-swap
  that commits the ``put`` (``_writes``); a put that never committed charged nothing,
  and its rerun (LangGraph replays the superstep, or reuses its tasks' saved writes)
  charges its messages when its own put commits;
- never twice: each charge's ``ref`` is the message's id, and a ref already in the
  ledger counts nothing (a replayed superstep, the same message carried by the next
  checkpoints, a retried put);
- visible: the head record is a stepstone run (``{prefix}/{thread}/``), so
  ``stepstone runs show``/``list`` (``--over-budget`` too) and the dashboard show it.

At the hard limit: a superstep's ``put`` (``source="loop"``) at or past it commits
(its checkpoint and charges are kept: the calls were made) and then raises
``ThreadOverBudget``; an ``invoke`` with new input on a thread at its limit is refused
by its first ``put``, before anything is written. With ``durability="sync"`` each put
comes before the next superstep, so the graph makes no call past the limit. Under
LangGraph's default (``"async"``) a put runs beside the next superstep, which may make
its call too: that answer is charged when the thread goes on (from its saved writes,
by id, once), never lost. The limit is the saver's ``budget``: to let the thread go on,
build the saver with a larger one and ``invoke(None, config)`` (or with new input).
Only the root namespace charges: a subgraph's messages are charged
when they reach the parent's channels (by id, once). A message without an id (a
channel not reduced by ``add_messages``) is not charged: its replay could not be told
from a new call. A thread made by ``copy_thread`` knows the source's refs (its copied
messages are not charged again) and starts its own spend at nothing. Tenant caps and
run-tree pools are not drawn from.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, CheckpointMetadata
from langgraph.checkpoint.base import Checkpoint as LGCheckpoint

from ..._budget import DIGITS, SPEND_KEY, Budget, Prices, check_budget, ledger_of, over, spend_now
from ..._checkpoint import Checkpoint, evolve
from ..._errors import ConflictError, InvalidWorkflow, StepstoneError
from ..._spending import charge_ledger
from .._drive import Load, Rule, Save, SaveMany
from ._writes import MAX_RETRIES

__all__ = ["ThreadOverBudget", "Usage", "usage_charges"]


class ThreadOverBudget(StepstoneError):
    """The thread's charged usage reached the saver's budget (``StepstoneSaver(budget=)``).

    Raised by the ``put`` that reached it, after its checkpoint and charges committed
    (nothing is lost; the graph stops before its next superstep), and by the first
    ``put`` of an ``invoke`` with new input on a thread at its limit (nothing written).
    """

    def __init__(self, message: str, thread_id: str, reason: str) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.reason = reason


def usage_charges(
    checkpoint: LGCheckpoint, new_versions: ChannelVersions, prices: Prices | None
) -> list[tuple[dict[str, Any], str]]:
    """The charges of the AI messages in the channels this checkpoint updated, each with
    the name it is booked under (the model's, as the message's metadata says it)."""
    found: list[tuple[dict[str, Any], str]] = []
    values = checkpoint["channel_values"]
    for channel in new_versions:
        value = values.get(channel)
        items = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            if not isinstance(item, AIMessage) or not item.id or not item.usage_metadata:
                continue
            usage = item.usage_metadata
            inputs, outputs = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
            usd = 0.0 if prices is None else prices.cost(inputs, outputs)
            model = item.response_metadata.get("model_name") or item.response_metadata.get("model")
            name = str(model) if model else "model"
            found.append(({"usd": usd, "tokens": inputs + outputs, "ref": item.id}, name))
    return found


def _over(ledger: Mapping[str, Any], budget: Budget, record: Checkpoint) -> str | None:
    """Why ``ledger`` is at or over ``budget`` (the saver's, the limit today), if it is."""
    ledger = {**ledger, "budget": budget.to_json()}
    return over(spend_now(evolve(record, state={SPEND_KEY: ledger}, signals=()), None))


class Usage:
    """The saver's ``put`` with its messages' usage charged to the thread's ledger."""

    store: Any
    budget: Budget | None
    prices: Prices | None

    def _usage_init(self, budget: Budget | None, prices: Prices | None) -> None:
        self.budget = check_budget(budget)
        if prices is not None and not isinstance(prices, Prices):
            raise InvalidWorkflow(f"prices must be a stepstone.Prices or None, got {prices!r}")
        self.prices = prices

    def _put_rule(
        self,
        config: RunnableConfig,
        checkpoint: LGCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Rule[Any]:
        inner = super()._put_rule(config, checkpoint, metadata, new_versions)  # type: ignore[misc]
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        if ns != "" or (self.budget is None and self.prices is None):
            return (yield from inner)
        ns_key = self._ns_key(thread_id, ns)  # type: ignore[attr-defined]
        if self.budget is not None and metadata.get("source") == "input":
            # New input on a thread at its limit: refused before anything is written,
            # so the graph makes no call the budget has no room for.
            head = yield Load(ns_key)
            reason = None if head is None else _over(ledger_of(head.state), self.budget, head)
            if reason is not None:
                raise ThreadOverBudget(
                    f"thread {thread_id!r} is at its budget ({reason}); nothing was written. "
                    "Build the saver with a larger budget to go on",
                    thread_id,
                    reason,
                )
        charges = usage_charges(checkpoint, new_versions, self.prices)
        heads: list[Checkpoint] = []
        committed = yield from self._charging(inner, ns_key, charges, heads)
        stored = heads[-1] if heads else None
        if self.budget is not None and metadata.get("source") == "loop" and stored is not None:
            reason = _over(ledger_of(stored.state), self.budget, stored)
            if reason is not None:
                raise ThreadOverBudget(
                    f"thread {thread_id!r} reached its budget ({reason}) at checkpoint "
                    f"{checkpoint['id']!r}, which is stored with its charges. Build the saver "
                    "with a larger budget and invoke(None, config) to go on",
                    thread_id,
                    reason,
                )
        return committed

    def _copy_thread_rule(self, source: str, target: str) -> Rule[Any]:
        """``copy_thread``, and the copy's head learns the source's refs: the messages it
        copied were paid for by the source, and are not charged again by its next put
        (its own spend starts at nothing)."""
        result = yield from super()._copy_thread_rule(source, target)  # type: ignore[misc]
        if self.budget is None and self.prices is None:
            return result
        copied = yield Load(self._ns_key(source, ""))  # type: ignore[attr-defined]
        refs = {} if copied is None else ledger_of(copied.state).get("refs", {})
        if not refs:
            return result
        for _ in range(MAX_RETRIES):
            head = yield Load(self._ns_key(target, ""))  # type: ignore[attr-defined]
            if head is None:
                return result
            ledger = dict(ledger_of(head.state))
            known = dict(ledger.get("refs", {}))
            if set(refs) <= set(known):
                return result
            # The refs alone, booked to the source: the target's totals stay its own.
            ledger["refs"] = {**{ref: f"copied from {source}" for ref in refs}, **known}
            try:
                yield Save(evolve(head, state={**head.state, SPEND_KEY: ledger}))
            except ConflictError:
                continue
            return result
        raise ConflictError(f"thread {target!r}: the head kept changing while copied")

    def _charging(
        self,
        inner: Rule[Any],
        ns_key: str,
        charges: list[tuple[dict[str, Any], str]],
        heads: list[Checkpoint],
    ) -> Generator[Any, Any, Any]:
        """Run the put rule ``inner``, adding ``charges`` to each save of the head: the
        compare-and-swap that commits the put commits them (a retry adds them to the
        head it reloaded; refs already there count nothing). The head saved is appended
        to ``heads``."""
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            try:
                effect = inner.send(sent) if thrown is None else inner.throw(thrown)
            except StopIteration as stop:
                return stop.value
            head = False
            at: int | None = None  # where the head is in a SaveMany
            if isinstance(effect, Save) and effect.checkpoint.run_id == ns_key:
                head = True
                effect = Save(self._charged(effect.checkpoint, charges))
            elif isinstance(effect, SaveMany):
                saves = list(effect.checkpoints)
                for n, saved in enumerate(saves):
                    if saved.run_id == ns_key:
                        at, saves[n] = n, self._charged(saved, charges)
                effect = SaveMany(tuple(saves))
            try:
                sent, thrown = (yield effect), None
                if head:
                    heads.append(sent)
                elif at is not None and isinstance(sent[at], Checkpoint):
                    heads.append(sent[at])
            except Exception as exc:  # noqa: BLE001 - handed to the rule, which decides
                sent, thrown = None, exc

    def _charged(self, head: Checkpoint, charges: list[tuple[dict[str, Any], str]]) -> Checkpoint:
        state = dict(head.state)
        ledger = dict(ledger_of(state))
        changed = False
        refs = ledger.get("refs", {})
        for charge, name in charges:
            if charge["ref"] in refs:
                continue  # charged by an earlier checkpoint: most of a thread's messages
            ledger, counted = charge_ledger(_NoPlan, {SPEND_KEY: ledger}, charge, name)
            changed = changed or counted
        if self.budget is not None and ledger.get("budget") != self.budget.to_json():
            ledger["budget"] = self.budget.to_json()  # the limit today, for runs show
            changed = True
        if self.prices is not None and changed:
            ledger["prices_as_of"] = self.prices.as_of
        if not changed:
            return head
        ledger["usd"] = round(float(ledger.get("usd", 0.0)), DIGITS)
        state[SPEND_KEY] = ledger
        return evolve(head, state=state)


class _NoPlanType:
    """``charge_ledger`` reads the plan's budget only to record it; the saver records its
    own (``_charged``)."""

    budget = None


_NoPlan: Any = _NoPlanType()
