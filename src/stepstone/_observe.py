"""Logs and, when ``opentelemetry-api`` is installed, traces and metrics.

Tracing is optional: without the package every span is a no-op context manager and
costs one attribute lookup.

A worker's run events (claimed, taken over, suspended, finished, failed, lease lost...)
are one table, ``EVENTS``, and one function, ``emit``: each is a log line on the
``stepstone`` logger whose record carries the ``RunEvent`` (``stepstone worker --json``
prints it as a JSON object), a counter and, for claims, a latency histogram under
OpenTelemetry, and a span when tracing is on.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ._errors import safe_text

__all__ = [
    "EVENTS",
    "RunEvent",
    "count_in_flight",
    "emit",
    "escape",
    "first_line",
    "logger",
    "span",
    "tracing",
]

logger = logging.getLogger("stepstone")

# Imported on first use, not at import time: opentelemetry's import costs tens of
# milliseconds that every command-line call would pay.
_otel_module: dict[str, Any] = {}


def _otel() -> Any:
    """Return ``opentelemetry.trace``, or None when it is not installed."""
    if "trace" not in _otel_module:
        try:
            _otel_module["trace"] = importlib.import_module("opentelemetry.trace")
        except ImportError:
            _otel_module["trace"] = None
    return _otel_module["trace"]


class _NoSpan:
    def set_attribute(self, key: str, value: Any) -> None:
        """Ignore the attribute: tracing is off."""

    def record_exception(self, exc: BaseException) -> None:
        """Ignore the exception: tracing is off."""


_NO_SPAN = _NoSpan()


class _SafeSpan:
    """A span whose recording never raises: exception text is user code (``__str__``)."""

    __slots__ = ("span",)

    def __init__(self, span: Any) -> None:
        self.span = span

    def set_attribute(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, value)

    def record_exception(self, exc: BaseException) -> None:
        try:
            self.span.record_exception(exc)
        except Exception:  # noqa: BLE001 - its __str__ raised: record what is known safely
            self.span.add_event("exception", {"exception.type": type(exc).__qualname__})


@contextlib.contextmanager
def _otel_span(name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    trace = _otel()
    tracer = trace.get_tracer("stepstone")
    # The SDK's own recording on exit calls str() on the exception; ours cannot fail.
    with tracer.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as current:
        safe = _SafeSpan(current)
        try:
            yield safe
        except BaseException as exc:
            safe.record_exception(exc)
            current.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__qualname__))
            raise


_NULL = contextlib.nullcontext(_NO_SPAN)


def tracing() -> bool:
    """Return whether spans go anywhere: otel is installed and a real provider is set.

    The API's default proxy provider records nothing, and opening its no-op spans costs
    several microseconds a step, so the runner skips them until an SDK is configured.
    """
    trace = _otel()
    if trace is None:
        return False
    return not isinstance(
        trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    )


def span(on: bool, name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """Open a span named ``name`` when ``on`` (see ``tracing``), else a shared no-op."""
    if not on:
        return _NULL
    return _otel_span(name, attributes)


# --- run events: what a worker did with a run, one table --------------------------------


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One thing a worker did with a run, logged by ``emit`` (and counted under OTel).

    ``detail`` holds short scalars only (an owner name, a count, an ISO time, an
    error's first line): never a run's state or input, which may hold secrets.
    """

    event: str
    run_id: str
    workflow: str | None = None
    version: str | None = None
    step: str | None = None
    detail: Mapping[str, str | int | float | None] = field(default_factory=dict)
    time: datetime = field(default_factory=lambda: datetime.now(UTC))

    def as_json(self) -> dict[str, Any]:
        """Return the event as one flat JSON object (``detail``'s fields beside the rest)."""
        head: dict[str, Any] = {
            "time": self.time.isoformat().replace("+00:00", "Z"),
            "event": self.event,
            "run_id": self.run_id,
            "workflow": self.workflow,
            "version": self.version,
            "step": self.step,
        }
        return {**{k: v for k, v in self.detail.items() if k not in head}, **head}

    def text(self) -> str:
        """Return the event as one log line, its stored text escaped (see ``escape``)."""
        say = EVENTS[self.event][1]
        parts = [f"{k}={escape(v)}" for k, v in self.detail.items() if v is not None]
        where = f" at step {escape(self.step)}" if self.step is not None else ""
        extra = f" [{' '.join(parts)}]" if parts else ""
        version = " unversioned" if self.version is None else f" version {escape(self.version)}"
        workflow = f"workflow {escape(self.workflow)}{version}"
        return f"run {escape(self.run_id)}: {say}{where} ({workflow}){extra}"


#: Each event: its log level, what its line says, the counter it adds to (or None).
#: ``-q`` keeps the WARNING and ERROR ones.
EVENTS: dict[str, tuple[int, str, str | None]] = {
    "claimed": (logging.INFO, "claimed", "stepstone.worker.claims"),
    "taken_over": (
        logging.WARNING,
        "taken over from an owner whose lease expired",
        "stepstone.worker.takeovers",
    ),
    "suspended": (logging.INFO, "suspended", "stepstone.worker.suspended"),
    "finished": (logging.INFO, "finished", "stepstone.worker.finished"),
    "failed": (logging.WARNING, "failed", "stepstone.worker.failed"),
    "cancelled": (logging.INFO, "cancelled", "stepstone.worker.cancelled"),
    "handed_over": (logging.INFO, "handed over (the worker is stopping)", None),
    "lease_lost": (
        logging.WARNING,
        "lease lost: another worker took it over",
        "stepstone.worker.lease_losses",
    ),
    "parked": (
        logging.ERROR,
        "parked as failed: its completed steps are not this workflow's",
        "stepstone.worker.failed",
    ),
    "given_back": (
        logging.WARNING,
        "given back after an unexpected error",
        "stepstone.worker.given_back",
    ),
}

# C0 and C1 controls, DEL and the bidirectional overrides (a line must read as it
# holds), and the HTML specials (a log line may end up in a web page).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029<>&]")


def escape(value: object) -> str:
    """Return ``value`` quoted when a string, every unsafe character as ``\\xNN``."""
    text = repr(value) if isinstance(value, str) else str(value)
    return _UNSAFE.sub(
        lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text
    )


def first_line(error: BaseException) -> str:
    """Return the first line of ``error``'s text, bounded, never raising."""
    text = safe_text(error, 500).strip()
    return text.splitlines()[0] if text else type(error).__name__


def emit(event: RunEvent) -> None:
    """Log ``event`` (the record carries it as ``stepstone_event``) and count it."""
    level, _say, metric = EVENTS[event.event]
    if logger.isEnabledFor(level):
        logger.log(level, "%s", event.text(), extra={"stepstone_event": event})
    meter = _meter()
    if meter is not None:
        meter.record(event, metric)
    if tracing():
        attributes: dict[str, str | int | float] = {
            "run_id": event.run_id,
            "workflow": event.workflow or "",
            "version": event.version or "",
            "step": event.step or "",
        }
        attributes.update({f"detail.{k}": v for k, v in event.detail.items() if v is not None})
        with span(True, f"stepstone.worker.{event.event}", **attributes):
            pass


# --- metrics: counters per event, claim latency, runs in flight -------------------------


class _Meter:
    """The worker's OpenTelemetry instruments, made once from the global meter provider.

    Made from the API's proxy provider when no SDK is set yet: its instruments start
    recording once the application sets one, so the order of set-up does not matter.
    """

    def __init__(self, metrics: Any) -> None:
        meter = metrics.get_meter("stepstone")
        self.counters = {
            name: meter.create_counter(name, unit="{run}", description=f"runs {event}")
            for event, (_level, _say, name) in EVENTS.items()
            if name is not None
        }
        self.steps = meter.create_counter(
            "stepstone.worker.steps", unit="{step}", description="steps completed by workers"
        )
        self.latency = meter.create_histogram(
            "stepstone.worker.claim_latency",
            unit="s",
            description="seconds from a run being due (queued, signalled, timer) to its claim",
        )
        self.sources: dict[int, Callable[[], int]] = {}
        meter.create_observable_gauge(
            "stepstone.worker.in_flight",
            callbacks=[self._in_flight],
            unit="{run}",
            description="runs a worker is driving now",
        )
        self._observation = metrics.Observation

    def _in_flight(self, _options: Any) -> Iterator[Any]:
        for source in list(self.sources.values()):
            yield self._observation(source())

    def record(self, event: RunEvent, metric: str | None) -> None:
        attributes = {"workflow": event.workflow or "", "version": event.version or ""}
        if metric is not None:
            self.counters[metric].add(1, attributes)
        steps = event.detail.get("steps")
        if isinstance(steps, int) and steps > 0:
            self.steps.add(steps, attributes)
        latency = event.detail.get("latency")
        if event.event == "claimed" and isinstance(latency, (int, float)):
            self.latency.record(latency, attributes)


_meters: dict[str, _Meter | None] = {}


def _meter() -> _Meter | None:
    """Return the instruments, or None when ``opentelemetry-api`` is not installed."""
    if "meter" not in _meters:
        try:
            metrics = importlib.import_module("opentelemetry.metrics")
        except ImportError:
            _meters["meter"] = None
        else:
            _meters["meter"] = _Meter(metrics)
    return _meters["meter"]


def count_in_flight(key: int, source: Callable[[], int] | None) -> None:
    """Report ``source()`` (a worker's runs in flight) in the gauge; None stops it."""
    meter = _meter()
    if meter is None:
        return
    if source is None:
        meter.sources.pop(key, None)
    else:
        meter.sources[key] = source
