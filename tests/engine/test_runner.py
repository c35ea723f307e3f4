"""Runner behaviour that does not depend on the backend: steps, retries, logs, traces."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import stepstone
from stepstone import (
    InvalidRunId,
    InvalidState,
    RetryPolicy,
    Step,
    StepContext,
    StepFailed,
    open_store,
    run,
)
from stepstone._checkpoint import check_run_id
from stepstone._codec import encode_state
from stepstone._runner import idempotency_key


def test_step_detects_context_parameter() -> None:
    """fn(state) gets one argument and fn(state, ctx) gets the context too."""
    seen: dict[str, Any] = {}

    def one(state: dict[str, Any]) -> None:
        seen["one"] = True

    def two(state: dict[str, Any], ctx: StepContext) -> None:
        seen["two"] = ctx.step_name

    class Callable:
        def __call__(self, state: dict[str, Any], ctx: StepContext) -> None:
            seen["obj"] = ctx.step_index

    run("r", [Step("a", one), Step("b", two), Step("c", Callable())], open_store("memory://"))
    assert seen == {"one": True, "two": "b", "obj": 2}


def test_step_validates_its_arguments() -> None:
    """A step needs a non-empty name and a callable."""
    with pytest.raises(stepstone.InvalidWorkflow, match="non-empty"):
        Step("", lambda s: None)
    with pytest.raises(TypeError, match="callable"):
        Step("a", 42)  # type: ignore[arg-type]


def test_run_refuses_non_steps_and_bad_ids() -> None:
    """run checks its run_id and steps before touching the store."""
    store = open_store("memory://")
    with pytest.raises(TypeError, match="Step objects"):
        run("r", [lambda s: None], store)
    with pytest.raises(InvalidRunId):
        run("", [], store)


@pytest.mark.parametrize("block", range(0, 0x110000, 0x10000))
def test_check_run_id_refuses_exactly_control_and_surrogate_characters(block: int) -> None:
    """Every code point of a plane (its first 0x3000, and the surrogates), alone and in an
    id: refused exactly when it is a control character or a surrogate. Printable ASCII
    takes a shortcut past the search; this holds it to the rule."""
    codes = [*range(block, block + 0x3000), 0xD800, 0xDBFF, 0xDC00, 0xDFFF, block + 0xFFFF]
    for code in codes:
        char = chr(code)
        bad = code <= 0x1F or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xDFFF
        for run_id in (char, f"run-{char}", f"{char}x"):
            if bad:
                with pytest.raises(InvalidRunId, match="control or surrogate"):
                    check_run_id(run_id)
            else:
                assert check_run_id(run_id) is run_id


def test_check_run_id_does_not_take_a_str_subclasss_word_for_it() -> None:
    """A ``str`` subclass whose ``isascii``/``isprintable`` say yes is still searched."""

    class Lying(str):
        def isascii(self) -> bool:
            return True

        def isprintable(self) -> bool:
            return True

    with pytest.raises(InvalidRunId, match="control or surrogate"):
        check_run_id(Lying("run\x00id"))


def test_step_returning_non_dict_fails() -> None:
    """A step returning something other than a dict or None fails the run clearly."""
    with pytest.raises(StepFailed) as info:
        run("r", [Step("a", lambda s: [1, 2])], open_store("memory://"))
    assert "returns a dict of updates or None" in str(info.value.__cause__)


def test_retry_policy_validation_and_backoff() -> None:
    """Retry delays grow by the multiplier up to the cap, with bounded jitter."""
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="between 0.0 and"):
        RetryPolicy(initial_delay=-1)
    policy = RetryPolicy(initial_delay=1, multiplier=3, max_delay=5, jitter=0)
    assert [policy.delay(n) for n in (1, 2, 3)] == [1, 3, 5]
    jittery = RetryPolicy(initial_delay=10, jitter=0.1)
    assert all(9 <= jittery.delay(1) <= 11 for _ in range(100))


def test_retry_predicate() -> None:
    """retry_on may be a predicate on the exception."""
    policy = RetryPolicy(retry_on=lambda exc: "transient" in str(exc))
    assert policy.should_retry(RuntimeError("transient glitch"))
    assert not policy.should_retry(RuntimeError("fatal"))


def test_idempotency_key_is_deterministic() -> None:
    """The key depends only on run, index and name."""
    assert idempotency_key("r", 0, "a") == idempotency_key("r", 0, "a")
    assert (
        len(
            {
                idempotency_key("r", 0, "a"),
                idempotency_key("r", 1, "a"),
                idempotency_key("r2", 0, "a"),
                idempotency_key("r", 0, "b"),
            }
        )
        == 4
    )


@pytest.mark.parametrize("value", ["text", 1, 1.5, True, None, [1, "a"], {"k": {"n": [None]}}])
def test_encode_state_accepts_json(value: Any) -> None:
    """Every JSON value round-trips and the copy equals the original."""
    text, copy = encode_state({"v": value})
    assert copy == {"v": value}


def test_encode_state_refuses_non_dict() -> None:
    """The top level of a state must be a dict."""
    with pytest.raises(InvalidState, match="must be a dict"):
        encode_state([1, 2])


def test_logging_lines(caplog: pytest.LogCaptureFixture) -> None:
    """A run logs start, resume with skipped count, finish and failure; no state above debug."""
    store = open_store("memory://")
    caplog.set_level(logging.INFO, logger="stepstone")

    def boom(state: dict[str, Any]) -> None:
        raise RuntimeError("secret-ish message")

    with pytest.raises(StepFailed):
        run("r", [Step("a", lambda s: {"a": "STATE-VALUE"}), Step("b", boom)], store)
    run("r", [Step("a", lambda s: {}), Step("b", lambda s: {"b": 1})], store)
    text = caplog.text
    assert "run 'r': starting, 2 steps" in text
    assert "resuming at step 1 ('b'), skipping 1 completed" in text
    assert "failed on attempt 1" in text
    assert "done after 2 steps" in text
    assert "STATE-VALUE" not in text


def test_spans_when_tracing_configured() -> None:
    """With an OpenTelemetry SDK configured, a run emits run, step and save spans."""
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    export = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory_exporter = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    from opentelemetry import trace

    exporter = memory_exporter.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    run("traced", [Step("a", lambda s: {"a": 1})], open_store("memory://"))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"stepstone.run", "stepstone.step", "stepstone.save"}
    assert spans["stepstone.step"].attributes["step"] == "a"
    assert spans["stepstone.step"].attributes["outcome"] == "ok"
    assert spans["stepstone.save"].parent.span_id == spans["stepstone.step"].context.span_id
    assert spans["stepstone.step"].parent.span_id == spans["stepstone.run"].context.span_id


def test_unprintable_exception_under_tracing_still_fails_the_step() -> None:
    """With spans on, a step error whose __str__ raises still ends in StepFailed, recorded."""
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    export = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory_exporter = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    from opentelemetry import trace

    exporter = memory_exporter.InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, sdk_trace.TracerProvider):
        provider = sdk_trace.TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))

    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text for you")

    def boom(state: dict[str, Any]) -> None:
        raise Nasty

    store = open_store("memory://")
    with pytest.raises(StepFailed):
        run("nasty-traced", [Step("boom", boom)], store)
    failed = store.load("nasty-traced")
    assert failed is not None and failed.failure is not None
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["stepstone.step"].attributes["outcome"] == "failed"
