"""Bugs the chaos harness and its fuzzers found, one test each, named after what broke.

Each test states the documented behaviour. While a bug is open its test is marked
``xfail(strict=True)``: the suite stays green, and the day the bug is fixed the test
XPASSes, which fails the run as a reminder to delete the marker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone
from stepstone import (
    Checkpoint,
    InvalidState,
    RetryPolicy,
    Step,
    StepFailed,
    StepstoneError,
    open_store,
    register_store,
    run,
)


@pytest.fixture(params=["memory", "file", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[stepstone.Store]:
    """Each built-in backend, fresh."""
    config = {
        "memory": "memory://",
        "file": f"file://{tmp_path}/runs",
        "sqlite": f"sqlite:///{tmp_path}/runs.db",
    }[request.param]
    with open_store(config) as opened:
        yield opened


def _nested(depth: int) -> dict[str, Any]:
    state: dict[str, Any] = {}
    cur = state
    for _ in range(depth):
        cur["a"] = {}
        cur = cur["a"]
    return state


# -- bugs ----------------------------------------------------------------------------------


def test_sqlite_save_of_lone_surrogate_escapes_as_unicode_encode_error(tmp_path: Path) -> None:
    """A lone surrogate in a state is InvalidState (nothing stored) or round-trips.

    Found by the state fuzzer: SQLiteStore.save let UnicodeEncodeError out of sqlite3's
    parameter binding. Fixed in ab3bc08 (states with lone surrogates are refused).
    """
    state = {"text": "half a pair: \ud800"}
    with open_store(f"sqlite:///{tmp_path}/runs.db") as store:
        try:
            store.save(Checkpoint(run_id="r", state=state))
        except InvalidState:
            assert store.load("r") is None
            return
        loaded = store.load("r")
        assert loaded is not None and loaded.state == state


def test_deeply_nested_state_raises_recursion_error_not_invalid_state(
    store: stepstone.Store,
) -> None:
    """A state too deep to encode is refused with InvalidState, and nothing is stored."""
    with pytest.raises(InvalidState):
        store.save(Checkpoint(run_id="deep", state=_nested(1000)))
    assert store.load("deep") is None


def test_step_returning_deep_state_raises_recursion_error_from_run(
    store: stepstone.Store,
) -> None:
    """run() fails the run on an unencodable step result (the cause an InvalidState); no
    step is stored."""
    with pytest.raises(StepFailed) as info:
        run("deep-run", [Step("a", lambda s: {"deep": _nested(1000)})], store)
    assert isinstance(info.value.__cause__, InvalidState)
    # The run's record exists from its claim on; the refused step left nothing in it but
    # the failure, and the lease was given back.
    cp = store.load("deep-run")
    assert cp is not None and cp.step == -1 and not cp.step_names and cp.owner is None, cp
    assert cp.status == "failed"


# Wrong types on purpose: what a caller without a type checker passes.
_MISUSE = [
    ("run(steps=list of non-Step)", lambda s: run("x", ["a"], s), TypeError),
    ("run(steps=None)", lambda s: run("x", None, s), TypeError),  # type: ignore[arg-type]
    ("Step(name='')", lambda s: Step("", len), TypeError),
    ("Step(fn=5)", lambda s: Step("x", 5), TypeError),  # type: ignore[arg-type]
    ("RetryPolicy(max_attempts=0)", lambda s: RetryPolicy(max_attempts=0), ValueError),
    (
        "register_store(5, ...)",
        lambda s: register_store(5, object),  # type: ignore[arg-type]
        AttributeError,
    ),
]


@pytest.mark.parametrize(("what", "call", "raised"), _MISUSE, ids=[m[0] for m in _MISUSE])
def test_bad_arguments_raise_builtin_errors_outside_the_stepstone_tree(
    what: str, call: Any, raised: type[BaseException], tmp_path: Path
) -> None:
    """Bad arguments raise a StepstoneError (that may also be a TypeError/ValueError)."""
    with open_store("memory://") as store:
        with pytest.raises(BaseException) as info:
            call(store)
        # Fixed: InvalidWorkflow is a TypeError and a ValueError too; bad schemes are
        # ConfigError. The builtin kinds still match where one fits.
        assert isinstance(info.value, raised) or raised is AttributeError
        assert isinstance(info.value, StepstoneError), f"{what}: {info.value!r}"


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_cosmos_rounds_integers_beyond_2_53_silently(
    emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state with a large int is saved exactly or refused (InvalidState); never rounded.

    Found by the chaos harness on its first Cosmos run: every case failed with "state
    after step k differs from the crash-free state", because the generated workflows
    carry an accumulator modulo 2**61 - 1 (e.g. 1222503162565419695 came back as
    1222503162565419800). save() returns the exact state, so the runner hands the exact
    value to the next step, but after a crash the resumed process loads the rounded one:
    resuming changes the result. Repro then: ``scripts/chaos --backend cosmos --seed 1
    --case 0``. Fixed in 39a5ecd (the state is stored as JSON text); 1.0 and -0.0 were
    changed the same way.
    """
    import uuid

    pytest.importorskip("azure.cosmos")
    monkeypatch.setenv("AZURE_COSMOS_KEY", emulator.key)
    monkeypatch.delenv("AZURE_COSMOS_CONNECTION_STRING", raising=False)
    protocol = "&protocol=http" if emulator.endpoint.startswith("http://") else ""
    config = (
        f"cosmos://{emulator.host}:{emulator.port}/regressions/r-{uuid.uuid4().hex[:10]}"
        f"?verify=false&create=true{protocol}"
    )
    state = {
        "acc": 1222503162565419695,
        "neg": -(2**53) - 1,
        "ok": 2**53 - 1,
        "one": 1.0,
        "negzero": -0.0,
        "nested": [{"big": 10**30}],
    }
    with open_store(config) as store:
        try:
            saved = store.save(Checkpoint(run_id="big-int", state=state))
        except InvalidState:
            assert store.load("big-int") is None
            return
        loaded = store.load("big-int")
        assert loaded is not None
        assert loaded.state == saved.state == state
        assert type(loaded.state["one"]) is float and str(loaded.state["negzero"]) == "-0.0"
