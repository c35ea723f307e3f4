"""The runtime's own rules, beside the contract suite: leases, codec paths, workers' inputs."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import stepstone
from stepstone import (
    InvalidState,
    InvalidWorkflow,
    Map,
    RetryPolicy,
    Sleep,
    Step,
    WaitFor,
    Worker,
    Workflow,
    _codec,
    _lease,
    _statejson,
    open_store,
    run,
)
from stepstone._checkpoint import Checkpoint, evolve
from stepstone._suspend import child_run_id
from stepstone.testing._contract import BAD_STATES

SRC = str(Path(stepstone.__file__).resolve().parents[1])


def test_evolve_is_replace() -> None:
    """``evolve`` copies every field and applies the changes, like dataclasses.replace."""
    from dataclasses import fields, replace

    cp = Checkpoint("r", step=2, state={"a": 1}, owner="o", epoch=3, consumed={"s": 1})
    changed = evolve(cp, step=3, owner=None)
    assert changed == replace(cp, step=3, owner=None)
    assert all(
        getattr(changed, f.name) == getattr(cp, f.name)
        for f in fields(cp)
        if f.name not in ("step", "owner")
    )
    with pytest.raises(TypeError):
        evolve(cp, no_such_field=1)  # type: ignore[call-arg]  # mypy refuses it too


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "stdlib"])
@pytest.mark.parametrize(("label", "state", "path"), BAD_STATES, ids=[b[0] for b in BAD_STATES])
def test_both_json_paths_refuse_alike(
    monkeypatch: pytest.MonkeyPatch, fast: bool, label: str, state: dict[str, Any], path: str
) -> None:
    """With or without orjson, a non-JSON state is refused with the same path."""
    if fast and _statejson._load_orjson() is None:
        pytest.skip("orjson is not installed")
    if not fast:
        monkeypatch.setattr(_statejson, "_orjson", None)
    with pytest.raises(InvalidState) as info:
        _codec.encode_state(state)
    assert info.value.path == path


@pytest.mark.parametrize(
    "state",
    [
        {"big": 2**70, "neg": -(2**80)},
        {"f": [1.0, -0.0, 1e16, 5e-324, 1.7976931348623157e308]},
        {"deep": json.loads("[" * 199 + "]" * 199)},
        {"u": "日本 \u2028 \x00 emoji \U0001f680"},
    ],
    ids=["bigint", "floats", "deep", "unicode"],
)
def test_both_json_paths_accept_alike(
    monkeypatch: pytest.MonkeyPatch, state: dict[str, Any]
) -> None:
    """Values orjson does not take (huge ints, deep nesting) still pass, by the fallback."""
    text, copy = _codec.encode_state(state)
    monkeypatch.setattr(_statejson, "_orjson", None)
    slow_text, slow_copy = _codec.encode_state(state)
    assert copy == slow_copy == state
    assert json.loads(text) == json.loads(slow_text)
    assert repr(copy) == repr(state)  # -0.0 keeps its sign, ints stay ints


def test_lease_bounds_are_checked() -> None:
    """A lease is seconds or a timedelta within bounds; anything else is a clear error."""
    assert _lease.check_lease(timedelta(seconds=5)) == 5.0
    for bad in (0, -1, float("nan"), 10**9, "30", True):
        with pytest.raises(InvalidWorkflow, match="lease"):
            _lease.check_lease(bad)


@pytest.mark.process
def test_owner_names_identify_this_machine() -> None:
    """An owner of this machine whose PID is gone is dead; one of another machine is not."""
    mine = _lease.new_owner()
    assert not _lease.dead_here(mine)  # this very process
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    parts = mine.split(":")
    parts[-3] = gone.stdout.strip()
    assert _lease.dead_here(":".join(parts))
    parts[-2] = "000000000000"  # another boot or PID namespace: cannot tell, so alive
    assert not _lease.dead_here(":".join(parts))
    assert not _lease.dead_here("garbage") and not _lease.dead_here(None)


@pytest.mark.crash
def test_direct_run_resumes_at_once_after_its_process_was_killed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run SIGKILLed mid-step with an hour's lease resumes at once: its owner is gone."""
    config = f"sqlite:///{tmp_path}/runs.db"
    child = textwrap.dedent(
        f"""
        import os, signal
        from stepstone import Step, open_store, run
        def die(state):
            os.kill(os.getpid(), signal.SIGKILL)
        with open_store({config!r}) as store:
            run("killed", [Step("a", lambda s: {{"a": 1}}), Step("b", die)], store, lease=3600)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", child],
        env={**os.environ, "PYTHONPATH": SRC},
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL
    with open_store(config) as store:
        held = store.load("killed")
        assert held is not None and held.owner is not None and held.lease == 3600
        with caplog.at_level(logging.WARNING, logger="stepstone"):
            state = run(
                "killed", [Step("a", lambda s: {"a": 1}), Step("b", lambda s: {"b": 2})], store
            )
    assert state == {"a": 1, "b": 2}
    assert "no longer exists" in caplog.text


def test_child_run_ids_are_deterministic_and_bounded() -> None:
    """Map child ids are PARENT/NAME/INDEX, hashed (and still unique) past the id limit."""
    assert child_run_id("p", "m", 3) == "p/m/3"
    assert child_run_id("x" * 1011, "m", 10**9).endswith("/m/1000000000")
    long = "x" * 1012
    hashed = child_run_id(long, "m", 7)
    assert hashed.startswith("map~") and hashed.endswith("/7") and len(hashed) <= 1024
    assert hashed == child_run_id(long, "m", 7) != child_run_id(long, "n", 7)


def test_suspending_steps_refuse_bad_arguments() -> None:
    """Sleep needs exactly one of duration and until, aware; WaitFor a name and JSON default."""
    with pytest.raises(InvalidWorkflow, match="exactly one"):
        Sleep("s")
    with pytest.raises(InvalidWorkflow, match="exactly one"):
        Sleep("s", duration=1, until=datetime.now(UTC))
    with pytest.raises(InvalidWorkflow, match="between"):
        Sleep("s", duration=-1)
    with pytest.raises(InvalidWorkflow, match="signal"):
        WaitFor("w", "")
    with pytest.raises(InvalidWorkflow, match="JSON"):
        WaitFor("w", "s", default={1, 2})
    with pytest.raises(InvalidWorkflow, match="Workflow"):
        Map("m", [Step("a", lambda s: None)], lambda s: [])  # type: ignore[arg-type]


def test_retry_policy_refuses_overflowing_values() -> None:
    """Huge delays or multipliers are refused at construction; big attempts never overflow."""
    for kwargs in (
        {"initial_delay": 1e300},
        {"multiplier": 1e9},
        {"max_delay": float("inf")},
        {"jitter": 2},
    ):
        with pytest.raises(InvalidWorkflow):
            RetryPolicy(**kwargs)
    policy = RetryPolicy(
        max_attempts=10**6, initial_delay=1, multiplier=1000, max_delay=60, jitter=0
    )
    assert policy.delay(10**6 - 1) == 60


def test_str_that_raises_still_fails_the_step(tmp_path: Path) -> None:
    """An exception whose __str__ raises ends in StepFailed with a saved failure."""

    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text for you")

    def boom(state: dict[str, Any]) -> None:
        raise Nasty

    with open_store(f"sqlite:///{tmp_path}/r.db") as store:
        with pytest.raises(stepstone.StepFailed):
            run("nasty", [Step("boom", boom)], store)
        failed = store.load("nasty")
    assert failed is not None and failed.failure is not None
    assert failed.failure.error_type.endswith("Nasty") and "raised" in failed.failure.message


def test_worker_refuses_bad_arguments(tmp_path: Path) -> None:
    """Worker validates its workflows, concurrency and lease up front."""
    flow = Workflow("w", [Step("a", lambda s: None)])
    with open_store("memory://") as store:
        with pytest.raises(InvalidWorkflow):
            Worker(store, [])
        with pytest.raises(InvalidWorkflow):
            Worker(store, [flow], concurrency=0)
        with pytest.raises(InvalidWorkflow, match="lease"):
            Worker(store, [flow], lease=-1)
        with pytest.raises(InvalidWorkflow, match="different workflows"):
            Worker(store, [flow, Workflow("w", [Step("b", lambda s: None)])])

        async def step(state: dict[str, Any]) -> None:
            return None

        worker = Worker(store, [Workflow("a", [Step("x", step)])])
        with pytest.raises(InvalidWorkflow, match="aserve"):
            worker.serve()


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "stdlib"])
def test_too_deep_state_is_refused(monkeypatch: pytest.MonkeyPatch, fast: bool) -> None:
    """A state nested past MAX_DEPTH is refused, so every saved state loads anywhere."""
    if not fast:
        monkeypatch.setattr(_statejson, "_orjson", None)
    fits = json.loads("[" * (_codec.MAX_DEPTH - 1) + "]" * (_codec.MAX_DEPTH - 1))
    _codec.encode_state({"x": fits})
    for depth in (_codec.MAX_DEPTH, 600, 900):
        with pytest.raises(InvalidState, match="deep"):
            _codec.encode_state({"x": json.loads("[" * depth + "]" * depth)})
    wide = {"items": [{"k": [i]} for i in range(500)]}  # many containers, shallow
    assert _codec.encode_state(wide)[1] == wide


@pytest.mark.parametrize(
    "payload",
    [
        {"messages": [], "n": 2**63, "deep": [{"a": [None, True, -1, "\u00e9\n\u2028\x7f"]}]},
        {"f": 1e16},
        {"f": 0.1},
        {"nan": float("nan")},
        {1: "an int key"},
        {"t": (1, "a")},
        {"when": datetime(2020, 1, 1, tzinfo=UTC)},
        {"big": 2**70},
        {"deep": json.loads("[" * 80 + "]" * 80)},
    ],
    ids=["plain", "1e16", "0.1", "nan", "int-key", "tuple", "datetime", "big-int", "deep"],
)
def test_a_document_is_the_standard_librarys_text_whatever_its_input(
    monkeypatch: pytest.MonkeyPatch, payload: dict[Any, Any]
) -> None:
    """An input orjson may write (issue 36) leaves the document as the standard library's."""
    if _statejson._load_orjson() is None:
        pytest.skip("orjson is not installed")
    cp = Checkpoint("r", step=1, state={}, step_names=("a",), input=payload)

    def document() -> str | type[Exception]:
        try:
            return _codec.encode_document(cp, "{}")
        except (TypeError, ValueError) as exc:
            return type(exc)

    fast = document()
    monkeypatch.setattr(_statejson, "_orjson", None)
    assert fast == document()


def test_a_document_naming_pieces_is_the_standard_librarys_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ``ref`` of a state in pieces, written by orjson (issue 36), is the text the
    standard library writes: its ints, piece keys and the base's time."""
    if _statejson._load_orjson() is None:
        pytest.skip("orjson is not installed")
    cp = Checkpoint("r", step=1, state={}, step_names=("a",))
    ref = {
        "gen": 3,
        "base": ["0000ab12cd34ef56:3.0a1b.b0", "0000ab12cd34ef56:3.0a1b.b1"],
        "base_bytes": 2_100_000,
        "log": ["0000ab12cd34ef56:3.9f.l0"],
        "log_bytes": 2048,
        "log_count": 1,
        "inc": "0000ab12cd34ef56",
        "at": round(1765143600.1234, 3),
    }
    fast = _codec.encode_document(cp, None, ref=ref)
    monkeypatch.setattr(_statejson, "_orjson", None)
    assert fast == _codec.encode_document(cp, None, ref=ref)
    assert json.loads(fast)[_codec.REF_KEY] == ref


def test_empty_workflow_finishes_without_an_owner() -> None:
    """A run of no steps is done at once and holds no lease afterwards."""
    with open_store("memory://") as store:
        assert run("empty", [], store, input={"a": 1}) == {"a": 1}
        cp = store.load("empty")
        assert cp is not None and cp.status == "done" and cp.owner is None
        info = stepstone.start(store, Workflow("nothing", []), "queued-empty")
        assert info.status == "done"  # nothing to queue: it is finished on arrival


@pytest.mark.parametrize("scheme", ["memory", "sqlite", "file"])
def test_import_keeps_timestamps(tmp_path: Path, scheme: str) -> None:
    """import_checkpoint saves by compare-and-swap but keeps created_at and updated_at."""
    config = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{tmp_path}/r.db",
        "file": f"file://{tmp_path}/runs",
    }[scheme]
    old = datetime(2020, 5, 17, 8, 30, tzinfo=UTC)
    with open_store(config) as store:
        cp = Checkpoint(
            "old",
            step=0,
            state={"a": 1},
            step_names=("a",),
            total_steps=2,
            created_at=old,
            updated_at=old + timedelta(hours=1),
        )
        saved = store.import_checkpoint(cp)
        assert (saved.created_at, saved.updated_at) == (old, old + timedelta(hours=1))
        loaded = store.load("old")
        assert loaded is not None and loaded.updated_at == old + timedelta(hours=1)
        info = {i.run_id: i for i in store.list_info()}["old"]
        assert info.updated_at == old + timedelta(hours=1)
        with pytest.raises(stepstone.ConflictError):
            store.import_checkpoint(cp)  # it exists now: compare-and-swap as ever
        later = store.save(evolve(loaded, step=1, step_names=("a", "b")))
        assert later.updated_at is not None and later.updated_at > old + timedelta(days=365)
