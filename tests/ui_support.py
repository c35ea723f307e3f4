"""What the dashboard's tests share: workflows, a served app, a worker, waiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from stepstone import Step, Store, WaitFor, Worker, Workflow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Where the browser tests save the README's screenshots.
IMG_DIR = Path(__file__).resolve().parents[1] / "docs" / "img"

# A step that fails while this holds a positive count, then succeeds: a failed run
# that a retry from the dashboard can finish.
FAIL_TIMES = {"left": 0}
_FAIL_LOCK = threading.Lock()


def flaky(state: dict[str, Any]) -> dict[str, Any]:
    with _FAIL_LOCK:
        if FAIL_TIMES["left"] > 0:
            FAIL_TIMES["left"] -= 1
            raise RuntimeError("the payment service answered 503 <b>Service Unavailable</b>")
    return {"charged": True}


def _draft(state: dict[str, Any]) -> dict[str, Any]:
    return {"draft": "Dear Ana, your refund is on its way."}


def _send(state: dict[str, Any]) -> dict[str, Any]:
    approval = state.get("approval") or {}
    return {"sent": bool(isinstance(approval, dict) and approval.get("ok"))}


APPROVAL = Workflow(
    "refund-approval",
    [Step("draft_reply", _draft), WaitFor("approval", "approval"), Step("send_reply", _send)],
    version="3",
)
PAYMENT = Workflow("payment", [Step("charge", flaky), Step("receipt", lambda s: {"r": 1})])
WORKFLOWS = [APPROVAL, PAYMENT]


def wait_until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait for ``check`` to hold; fail naming ``what`` if it does not within ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


@contextmanager
def serving(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free port of ``host``; yield its base URL."""
    import uvicorn

    # A page still open holds its live updates' response open, which uvicorn would wait for
    # without end on shutdown (the join below then ran out its time after each such test):
    # a second's grace, then that response is cancelled, as when an operator stops the
    # dashboard under an open page.
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=0,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=1,
        )
    )
    thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), "uvicorn to start", 20)
    if not server.started:
        pytest.fail(f"uvicorn did not start on {host}")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
    if thread.is_alive():
        pytest.fail(f"uvicorn on {host}:{port} did not stop within 30 s of being asked to")


@contextmanager
def working(store: Store) -> Iterator[Worker]:
    """Run a worker for ``WORKFLOWS`` in this process while the block runs."""
    worker = Worker(store, WORKFLOWS, poll=0.05, lease=5)
    thread = threading.Thread(target=worker.serve, name="worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)
