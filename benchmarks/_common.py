"""Helpers shared by the benchmark scripts in this folder (not part of stepstone).

The measuring itself (floors, interleaved repeats, statistics) lives in
``stepstone._bench`` so that ``stepstone bench`` and these scripts measure the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Stores live here: on the real disk (tmpfs would make every fsync free).
TMP = HERE / ".tmp"


def parse_args(description: str, extra: Sequence[str] = ()) -> argparse.Namespace:
    """Parse the options every script takes: --quick, --json, --repeats, --cosmos."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per figure")
    if "cosmos" in extra:
        parser.add_argument(
            "--cosmos", action="store_true", help="also measure Cosmos DB (emulator)"
        )
    return parser.parse_args()


def settings(
    args: argparse.Namespace, full: tuple[int, float], quick: tuple[int, float]
) -> tuple[int, float]:
    """Return (repeats, seconds per timed batch) for the chosen mode."""
    repeats, target_s = quick if args.quick else full
    return (args.repeats or repeats), target_s


@contextlib.contextmanager
def scratch(name: str) -> Iterator[Path]:
    """Yield a fresh directory under benchmarks/.tmp, removed afterwards whatever happens."""
    TMP.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=TMP))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fig(d: dict[str, Any] | None, unit: str = "us") -> str:
    """Format a ``Stats.to_json`` figure as 'median [min-max]'."""
    if d is None:
        return "-"
    if unit == "x":
        return f"{d['median']:.2f}x [{d['min']:.2f}-{d['max']:.2f}]"
    return f"{_num(d['median'])} [{_num(d['min'])}-{_num(d['max'])}]"


def _num(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Return a plain-text table, columns padded to fit."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def emit(args: argparse.Namespace, payload: dict[str, Any], text: str) -> None:
    """Print the JSON payload (--json) or the human-readable text."""
    if args.json:
        print(json.dumps(payload))
    else:
        print(text)


def progress(args: argparse.Namespace, message: str) -> None:
    """Tell a person what is being measured (stderr, so --json output stays clean)."""
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def cosmos_config(
    database: str = "benchdb", container: str = "runs"
) -> Iterator[tuple[str | None, str]]:
    """Yield (config string, description) for a Cosmos store, or (None, why not).

    ``STEPSTONE_BENCH_COSMOS`` (a full config string, key in ``AZURE_COSMOS_KEY``) wins;
    otherwise the test helper ``tests/cosmos_emulator.py`` starts an emulator.
    """
    given = os.environ.get("STEPSTONE_BENCH_COSMOS")
    if given:
        yield given, "STEPSTONE_BENCH_COSMOS"
        return
    try:
        import stepstone.stores.cosmos  # noqa: F401
    except ImportError as exc:
        yield None, f"no cosmos store in this stepstone ({exc})"
        return
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from cosmos_emulator import cosmos_emulator
    except ImportError as exc:
        yield None, f"tests/cosmos_emulator.py not importable ({exc})"
        return
    with contextlib.ExitStack() as stack:
        try:
            emu = stack.enter_context(cosmos_emulator())
        except Exception as exc:
            yield None, f"emulator not available ({type(exc).__name__}: {exc})"
            return
        old_key = os.environ.get("AZURE_COSMOS_KEY")
        os.environ["AZURE_COSMOS_KEY"] = emu.key
        stack.callback(_restore_env, "AZURE_COSMOS_KEY", old_key)
        # The emulator's certificate is self-signed: do not verify it, and do not warn
        # once per request that we do not.
        warnings.filterwarnings("ignore", message="Unverified HTTPS request")
        protocol = "http" if emu.endpoint.startswith("http:") else "https"
        config = (
            f"cosmos://{emu.host}:{emu.port}/{database}/{container}"
            f"?protocol={protocol}&verify=false&create=true"
        )
        yield config, f"{emu.kind} emulator ({emu.mode}) at {emu.endpoint}"


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
