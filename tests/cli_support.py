"""The ``stepstone`` command run in this process, for the tests of every subject that call it.

``cli(...)`` runs ``stepstone.cli.main(argv)`` (so coverage sees it) with its output
captured, and fails the test if a credential it was given shows in what it printed.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

from stepstone.cli import main

__all__ = ["KEY_ENV", "Result", "cli", "secrets_to_hide", "store_url"]

KEY_ENV = "AZURE_COSMOS_KEY"


def store_url(kind: str, base: Path, name: str = "store") -> str:
    """Return a config string of a local ``kind`` (sqlite, file) for a store under ``base``."""
    if kind == "sqlite":
        return f"sqlite:///{base}/{name}.db"  # base is absolute: sqlite:////abs/x.db
    assert kind == "file", kind
    return f"file:{base}/{name}"


def secrets_to_hide(env: dict[str, str]) -> list[str]:
    """Return the credentials in ``env``, in the spellings they could be printed in."""
    key = env.get(KEY_ENV, "")
    return [s for s in {key, quote(key, safe=""), key[:24]} if len(s) >= 16]


class Result(NamedTuple):
    """What a command did: its exit status and its output (unpacks as a tuple too)."""

    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Result:
    """Run ``stepstone ARGS`` in this process through ``main(argv)``; return its result.

    ``STEPSTONE_STORE`` is unset and ``env`` set for the call only, key by key (never the
    whole environment cleared: a worker thread of the test may be reading it meanwhile).
    """
    changes: dict[str, str | None] = {"STEPSTONE_STORE": None, **(env or {})}
    saved = {key: os.environ.get(key) for key in changes}
    saved_cwd = os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    try:
        _set(changes)
        full_env = dict(os.environ)
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(saved_cwd)
        _set(saved)
    result = Result(code, out.getvalue(), err.getvalue())
    for secret in secrets_to_hide(full_env):
        assert secret not in result.stdout + result.stderr, f"credential printed by {args}"
    return result


def _set(values: dict[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
