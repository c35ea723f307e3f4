"""Logs and, when ``opentelemetry-api`` is installed, traces.

Tracing is optional: without the package every span is a no-op context manager and
costs one attribute lookup.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator
from typing import Any

__all__ = ["logger", "span", "tracing"]

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
