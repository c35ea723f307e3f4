"""Save and load of a 64 MiB state per backend: seconds, bytes and pieces stored.

Plain figures, no assertions: ``python benchmarks/bench_big_state.py``. Each backend
that is reachable (memory, file, sqlite always; PostgreSQL and MySQL on loopback;
Cosmos if ``STEPSTONE_BENCH_COSMOS`` gives a config string, the key in
``AZURE_COSMOS_KEY``) gets a fresh store; a backend that is not reachable is named.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from typing import Any

from stepstone import Store, open_store
from stepstone._checkpoint import Checkpoint

State = dict[str, Any]


def big_state() -> State:
    """One 40 MiB string and 24k small dicts: about 64 MiB of JSON."""
    return {
        "blob": "é" * (20 << 20),
        "rows": [{"i": i, "name": f"row-{i}", "v": [i, i * 2, "x" * 900]} for i in range(24_000)],
    }


def configs(tmp: str) -> list[tuple[str, str]]:
    """(backend, config) of a fresh store of each backend this machine may have."""
    table = f"bench_{uuid.uuid4().hex[:12]}"
    found = [
        ("memory", f"memory://bench-{uuid.uuid4().hex}"),
        ("file", f"file://{tmp}/runs"),
        ("sqlite", f"sqlite:///{tmp}/runs.db"),
        ("postgresql", f"postgresql://postgres@127.0.0.1:5432/test?table={table}"),
        ("mysql", f"mysql://root@127.0.0.1:3306/test?table={table}"),
    ]
    cosmos = os.environ.get("STEPSTONE_BENCH_COSMOS")
    if cosmos:
        found.append(("cosmos", cosmos))
    return found


def measure(store: Store, state: State) -> tuple[float, float, int, int]:
    """(save seconds, load seconds, bytes in pieces, pieces) of one whole save and load."""
    began = time.perf_counter()
    store.save(Checkpoint("big", state=state))
    saved = time.perf_counter() - began
    began = time.perf_counter()
    loaded = store.load("big")
    took = time.perf_counter() - began
    if loaded is None or loaded.state != state:
        raise RuntimeError("the state loaded is not the state saved")
    keys = store.piece_keys("big") if type(store).holds_pieces else []
    held = sum(map(len, store.pieces("big", keys).values())) if keys else 0
    return saved, took, held, len(keys)


def main() -> None:
    """Print one line per backend."""
    state = big_state()
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in configs(tmp):
            try:
                with open_store(config) as store:
                    saved, loaded, held, count = measure(store, state)
                    store.delete("big")
            except Exception as exc:  # noqa: BLE001 - a backend that fails is named, never hidden
                print(f"{name:<11} unavailable or failed: {type(exc).__name__}: {exc}"[:300])
                continue
            print(
                f"{name:<11} save {saved:6.2f} s  load {loaded:6.2f} s  "
                f"{held / (1 << 20):6.1f} MiB in {count} pieces"
            )


if __name__ == "__main__":
    main()
