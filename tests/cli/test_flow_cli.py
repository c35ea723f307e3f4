"""``stepstone limits list|show|set`` (issue 37) and limit records kept out of ``runs``."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from child_process import last_line
from cli_support import cli
from fresh_stores import fresh_config
from stepstone import Limit, Step, Suspended, open_store, run, set_limit


def test_set_list_show(tmp_path: Path) -> None:
    """set creates and changes a limit (other values kept); list and show print it."""
    url = f"sqlite:///{tmp_path}/runs.db"
    made = cli("--store", url, "limits", "set", "openai", "--concurrency", "8", "--rpm", "500")
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == "openai: concurrency 8, 500 requests/60s, queue"
    changed = cli("--store", url, "limits", "set", "openai", "--tpm", "1000", "--unset", "rpm")
    assert changed.stdout.strip() == "openai: concurrency 8, 1000 tokens/60s, queue"
    listed = json.loads(cli("--store", url, "limits", "list", "--json").stdout)
    assert [(row["key"], row["concurrency"], row["rpm"]) for row in listed] == [("openai", 8, None)]
    shown = cli("--store", url, "limits", "show", "openai")
    assert "holders:  0" in shown.stdout and "waiters:  0" in shown.stdout


@pytest.mark.parametrize("kind", ["sqlite", "cosmos"])
def test_show_names_holders_and_waiters(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """show lists who holds a key and who is parked on it; runs list hides the record."""
    url = fresh_config(kind, request, tmp_path)
    with open_store(url) as store:
        set_limit(store, Limit("gpu", concurrency=1))

        def inner(state: dict[str, object]) -> None:
            with contextlib.suppress(Suspended):
                run("waiter", [Step("w", lambda s: None, limits=["gpu"])], store)
            shown = json.loads(cli("--store", url, "limits", "show", "gpu", "--json").stdout)
            assert list(shown["holders"]) == ["holder"] and shown["waiters"] == ["waiter"]

        run("holder", [Step("h", inner, limits=["gpu"])], store)
    listed = json.loads(cli("--store", url, "runs", "list", "--json").stdout)
    rows = listed["runs"] if isinstance(listed, dict) else listed
    assert sorted(row["run_id"] for row in rows) == ["holder", "waiter"]
    waiting = next(row for row in rows if row["run_id"] == "waiter")
    assert waiting["status"] == "waiting"


def test_bad_values_are_usage_errors(tmp_path: Path) -> None:
    """A limit of 0, a rate with no window, or an unknown key exit 2 or 1 with one line."""
    url = f"sqlite:///{tmp_path}/runs.db"
    zero = cli("--store", url, "limits", "set", "k", "--concurrency", "0")
    assert zero.returncode == 2 and "concurrency must be > 0" in zero.stderr
    window = cli("--store", url, "limits", "set", "k", "--requests", "5")
    assert window.returncode == 2 and "window" in window.stderr
    missing = cli("--store", url, "limits", "show", "nope")
    assert missing.returncode == 1 and "no limit 'nope'" in missing.stderr


#: What ``stepstone --help`` must not import: flow control (and asyncio with it, ~25 ms
#: of every command's start; ``--policy``'s choices are ``_flow_policy``'s) and the
#: runtime under the store contract (the checkpoint record, leases, the state log,
#: budgets): its parser needs their names, not their code.
HELP_MUST_NOT_IMPORT = (
    "asyncio",
    "stepstone._flow",
    "stepstone._store",
    "stepstone._checkpoint",
    "stepstone._lease",
    "stepstone._statelog",
    "stepstone._budget",
)


@pytest.mark.process
def test_help_imports_neither_the_runtime_nor_flow_control() -> None:
    """``stepstone --help`` builds every parser without importing the runtime, flow
    control or asyncio: a fresh interpreter says what it loaded."""
    code = (
        "import contextlib, io, sys\n"
        "from stepstone.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"banned = {HELP_MUST_NOT_IMPORT!r}\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'asyncio' or any(\n"
        "    m == b or m.startswith(b + '.') for b in banned)))\n"
    )
    assert last_line("-c", code) == "[]"
