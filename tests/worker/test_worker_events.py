"""The run events a worker reports: `stepstone worker`'s lines, and OpenTelemetry.

Real `stepstone worker` processes on a SQLite store, fed with `stepstone runs start`
and `stepstone runs signal`; each wait reads the worker's output line by line until
the line it waits for, with a timeout that names what hung.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import Step, Workflow, open_store, start
from stepstone._observe import EVENTS, RunEvent, escape, first_line
from stepstone.worker import Worker
from worker_support import FLOWS, WAIT, WorkerProcess, event_line, queue_run, stepstone_cli


@pytest.fixture
def flows(tmp_path: Path) -> str:
    """Write the workflows module; return the SQLite store's URL."""
    (tmp_path / "flows.py").write_text(FLOWS)
    return f"sqlite:///{tmp_path}/runs.db"


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    made: list[WorkerProcess] = []
    yield made
    for worker in made:
        worker.kill()


@pytest.mark.process
def test_worker_prints_each_event_of_a_run(
    tmp_path: Path, flows: str, workers: list[WorkerProcess]
) -> None:
    """Claimed, suspended for the signal, claimed again, finished; and a failed run."""
    queue_run(tmp_path, flows, "approve", "a1")
    queue_run(tmp_path, flows, "boom", "b1")
    worker = WorkerProcess(tmp_path, flows)
    workers.append(worker)
    log = worker.stderr
    log.wait("a1 claimed", event_line("a1", "claimed"))
    suspended = log.wait("a1 suspended", event_line("a1", "suspended"))
    assert "signal='go'" in suspended and suspended.startswith("stepstone: INFO: ")
    failed = log.find("b1 failed", event_line("b1", "failed"))
    # The error's first line only, its HTML escaped; the event is a warning.
    assert "error='bad \\x3cinput\\x3e'" in failed and "second line" not in failed
    assert failed.startswith("stepstone: WARNING: ") and "at step 'explode'" in failed
    sent = stepstone_cli(tmp_path, "runs", "signal", "a1", "go", "--store", flows)
    assert sent.returncode == 0, sent.stderr
    log.wait("a1 claimed again after its signal", event_line("a1", "claimed"))
    finished = log.wait("a1 finished", event_line("a1", "finished"))
    assert "workflow 'approve'" in finished
    assert worker.stop() == 0
    # One line per event: the engine's own INFO lines (waiting for, done after) are not.
    assert not [line for line in log.seen if "done after" in line or "waiting for signal" in line]


@pytest.mark.process
def test_quiet_prints_no_info_lines(
    tmp_path: Path, flows: str, workers: list[WorkerProcess]
) -> None:
    """-q: a finished run prints nothing; a failed one still prints its warning."""
    queue_run(tmp_path, flows, "approve", "q1")
    stepstone_cli(tmp_path, "runs", "signal", "q1", "go", "--store", flows)
    queue_run(tmp_path, flows, "boom", "q2")
    worker = WorkerProcess(tmp_path, flows, "-q")
    workers.append(worker)
    worker.stderr.wait("q2 failed", event_line("q2", "failed"))
    # The finished run: waited on through the store, the worker prints nothing of it.
    store = open_store(flows)
    deadline = time.monotonic() + WAIT
    while (cp := store.load("q1")) is None or cp.status != "done":
        assert time.monotonic() < deadline, f"timed out waiting for q1 to finish: {cp}"
        time.sleep(0.05)
    store.close()
    assert worker.stop() == 0
    worker.stderr.wait("the worker's signal line", lambda line: "SIGTERM" in line)
    assert not [line for line in worker.stderr.seen if "INFO" in line], worker.stderr.seen


@pytest.mark.process
def test_json_lines_carry_the_fields(
    tmp_path: Path, flows: str, workers: list[WorkerProcess]
) -> None:
    """--json: each event is one JSON object per line on stdout, with its fields."""
    queue_run(tmp_path, flows, "approve", "j1")
    worker = WorkerProcess(tmp_path, flows, "--json")
    workers.append(worker)

    def event(run_id: str, name: str) -> Callable[[str], bool]:
        def match(line: str) -> bool:
            value = json.loads(line)  # every line of stdout parses
            return bool(value.get("run_id") == run_id and value.get("event") == name)

        return match

    claimed = json.loads(worker.stdout.wait("j1 claimed", event("j1", "claimed")))
    assert {"time", "event", "run_id", "workflow", "version", "step"} <= set(claimed)
    assert claimed["workflow"] == "approve" and claimed["step"] == "draft"
    assert claimed["status"] == "queued" and claimed["epoch"] >= 1
    assert isinstance(claimed["latency"], float) and claimed["latency"] >= 0
    suspended = json.loads(worker.stdout.wait("j1 suspended", event("j1", "suspended")))
    assert suspended["signal"] == "go" and suspended["waiting_for"] == "signal go"
    assert "state" not in suspended and "d" not in suspended  # never the run's state
    assert worker.stop() == 0
    worker.stdout.wait("the stopped line", lambda line: json.loads(line)["event"] == "stopped")
    assert all("run " not in line for line in worker.stderr.seen)  # events only on stdout


@pytest.mark.crash
def test_a_killed_owners_run_is_taken_over(
    tmp_path: Path, flows: str, workers: list[WorkerProcess]
) -> None:
    """A worker SIGKILLed in a step: another worker logs the takeover and finishes it."""
    queue_run(tmp_path, flows, "hold", "h1")
    first = WorkerProcess(tmp_path, flows, hold=True)
    workers.append(first)
    first.stderr.wait("h1 claimed by the first worker", event_line("h1", "claimed"))
    first.proc.kill()  # SIGKILL: no hand-over, the lease must expire
    first.proc.wait(timeout=WAIT)
    second = WorkerProcess(tmp_path, flows)
    workers.append(second)
    taken = second.stderr.wait("h1 taken over", event_line("h1", "taken over"))
    assert "previous_owner='worker:" in taken and "WARNING" in taken
    second.stderr.wait("h1 finished by the second worker", event_line("h1", "finished"))
    assert second.stop() == 0


@pytest.mark.process
def test_runs_start_then_a_worker_finishes_it(
    tmp_path: Path, flows: str, workers: list[WorkerProcess]
) -> None:
    """`runs start` queues a run with its input, printed as JSON; a worker finishes it."""
    proc = stepstone_cli(
        tmp_path,
        "runs",
        "start",
        "hold",
        "s1",
        "--workflows",
        "flows:WORKFLOWS",
        "--input",
        '{"n": 1}',
        "--json",
        "--store",
        flows,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "run_id": "s1",
        "workflow": "hold",
        "version": None,
        "status": "queued",
    }
    worker = WorkerProcess(tmp_path, flows)
    workers.append(worker)
    worker.stderr.wait("s1 finished", event_line("s1", "finished"))
    assert worker.stop() == 0
    store = open_store(flows)
    cp = store.load("s1")
    store.close()
    assert cp is not None and cp.input == {"n": 1} and cp.state == {"n": 1, "held": True}


# --- the event type, in process ---------------------------------------------------------


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_event_text_is_escaped_and_never_raises() -> None:
    """Control and HTML characters are escaped; an unprintable error still has a line."""
    assert first_line(_Unprintable()).startswith("<_Unprintable.__str__ raised")
    assert first_line(ValueError("")) == "ValueError"
    event = RunEvent(
        "failed",
        "r\x1b[31m<b>",
        "w",
        None,
        "s\u202e",
        {"error": first_line(_Unprintable())},
    )
    text = event.text()
    assert "\x1b" not in text and "<" not in text and "\u202e" not in text
    assert "\\x1b[31m\\x3cb\\x3e" in text and "\\u202e" in text
    assert escape(None) == "None" and escape(1.5) == "1.5"
    assert json.loads(json.dumps(event.as_json()))["run_id"] == "r\x1b[31m<b>"
    assert set(EVENTS) >= {"claimed", "taken_over", "suspended", "finished", "failed", "lease_lost"}


def _serve(worker: Worker, until: Callable[[], bool], what: str) -> None:
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    try:
        while not until():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)
    finally:
        worker.stop()
        thread.join(WAIT)
    assert not thread.is_alive(), "the worker did not stop"


def _meter_reader() -> Any:
    """Return the in-memory reader of the process's SDK meter provider (set once here)."""
    sdk_metrics = pytest.importorskip("opentelemetry.sdk.metrics")
    export = pytest.importorskip("opentelemetry.sdk.metrics.export")
    from opentelemetry import metrics

    reader = _READER.get("reader")
    if reader is None:
        if isinstance(metrics.get_meter_provider(), sdk_metrics.MeterProvider):
            pytest.skip("another test set a meter provider without our reader")
        reader = export.InMemoryMetricReader()
        metrics.set_meter_provider(sdk_metrics.MeterProvider(metric_readers=[reader]))
        _READER["reader"] = reader
    return reader


_READER: dict[str, Any] = {}


def _points(reader: Any) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def _total(points: list[Any], workflow: str) -> float:
    return float(sum(p.value for p in points if dict(p.attributes).get("workflow") == workflow))


def test_events_are_counted_and_traced_under_opentelemetry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Claims, finished and failed runs and steps are counted; claims timed; spans made."""
    reader = _meter_reader()
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    trace_export = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    from opentelemetry import trace

    # A provider of this test's own, not the process's: the global one can be set only
    # once, and other tests set theirs.
    provider = sdk_trace.TracerProvider()
    exporter = memory.InMemorySpanExporter()
    provider.add_span_processor(trace_export.SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    monkeypatch.setattr(trace, "get_tracer", lambda name, *_a, **_k: provider.get_tracer(name))

    def boom(state: dict[str, Any]) -> None:
        raise _Unprintable

    good = Workflow("otel-good", [Step("a", lambda s: {"a": 1}), Step("b", lambda s: {"b": 2})])
    bad = Workflow("otel-bad", [Step("x", boom)])
    store = open_store("memory://")
    start(store, good, "g1")
    start(store, bad, "x1")
    worker = Worker(store, [good, bad], poll=0.05)

    points: dict[str, list[Any]] = {}

    def both_counted() -> bool:
        # Read while the worker serves: its in-flight gauge is reported only meanwhile.
        # Each run's event follows its last save: wait on the counters, not the store.
        points.clear()
        points.update(_points(reader))
        ends = ("stepstone.worker.finished", "stepstone.worker.failed")
        return all(name in points for name in ends)

    _serve(worker, both_counted, "the finished and the failed run to be counted")
    assert _total(points["stepstone.worker.claims"], "otel-good") >= 1
    assert _total(points["stepstone.worker.finished"], "otel-good") >= 1
    assert _total(points["stepstone.worker.failed"], "otel-bad") >= 1
    assert _total(points["stepstone.worker.steps"], "otel-good") >= 2
    latency = [p for p in points["stepstone.worker.claim_latency"] if p.count]
    assert latency and all(p.min >= 0 for p in latency)
    assert "stepstone.worker.in_flight" in points
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("stepstone.worker.")]
    names = {s.name for s in spans}
    assert {
        "stepstone.worker.claimed",
        "stepstone.worker.finished",
        "stepstone.worker.failed",
    } <= names
    failed = next(s for s in spans if s.name == "stepstone.worker.failed")
    assert failed.attributes["run_id"] == "x1"
    assert str(failed.attributes["detail.error"]).startswith("<_Unprintable.__str__ raised")


def test_each_end_of_an_execution_is_its_event() -> None:
    """A lost lease, a cancel, a suspension and an unexpected error each have their event."""
    from stepstone import LeaseLost, RunCancelled, Suspended
    from stepstone._checks import make_plan
    from stepstone.worker._outcomes import ending

    wf = Workflow("ends", [Step("a", lambda s: {}), Step("b", lambda s: {})], version="7")
    plan = make_plan("e1", wf, open_store("memory://"), input=None, lease=5, asynchronous=False)
    lost = ending(plan, LeaseLost("another worker holds it", "e1"))
    assert (lost.event, lost.workflow, lost.version) == ("lease_lost", "ends", "7")
    assert lost.detail["error"] == "another worker holds it"
    assert ending(plan, RunCancelled("e1")).event == "cancelled"
    waiting = ending(plan, Suspended("e1", "children 1 of 3", None))
    assert (waiting.event, waiting.detail["children"]) == ("suspended", "1 of 3")
    done = ending(plan, None)
    assert (done.event, done.detail["steps"], done.step) == ("finished", 2, None)
    odd = ending(plan, _Unprintable())
    assert odd.event == "given_back" and odd.detail["error_type"] == "_Unprintable"


def test_a_claims_latency_counts_from_the_write_that_made_it_due_not_from_1970() -> None:
    """A signalled or nudged run is due at the "due now" mark near 1970; its latency is not."""
    from datetime import timedelta

    from stepstone import Checkpoint
    from stepstone._checkpoint import DUE_NOW, utcnow
    from stepstone._checks import make_plan
    from stepstone.stores.memory import MemoryStore
    from stepstone.worker._outcomes import claim_event

    wf = Workflow("w", [Step("a", lambda s: s)])
    plan = make_plan("r", wf, MemoryStore(), input=None, lease=None, asynchronous=False)
    written = utcnow() - timedelta(seconds=2)
    for wake_at in (DUE_NOW, DUE_NOW + timedelta(seconds=3)):
        loaded = Checkpoint("r", wake_at=wake_at, updated_at=written)
        event = claim_event(plan, loaded, loaded)
        latency = event.detail["latency"]
        assert isinstance(latency, float)
        assert 1.0 <= latency < 3600, f"latency {latency} s for a run written 2 s ago"
