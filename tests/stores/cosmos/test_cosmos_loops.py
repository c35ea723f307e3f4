"""One Cosmos store used from several event loops leaks no aiohttp session.

The store keeps an aio client per event loop (aiohttp sessions belong to the loop that
made them). Each is closed on its own loop: by ``aclose``, or when the loop shuts down
(``asyncio.run`` ends), so a loop that ends while the store stays open leaves no
"Unclosed client session" behind, and the next loop gets a client of its own.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("azure.cosmos")

from stepstone import Checkpoint, open_store
from stepstone.stores.cosmos import CosmosStore

pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")

#: Seconds an async call may take before the test fails naming it.
TIMEOUT = 60.0


@pytest.fixture
def config(emulator: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A config string for a fresh container on the emulator, created on first use."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", emulator.key)
    monkeypatch.delenv("AZURE_COSMOS_CONNECTION_STRING", raising=False)
    protocol = "&protocol=http" if emulator.endpoint.startswith("http://") else ""
    return (
        f"cosmos://{emulator.host}:{emulator.port}/stepstone-test/loops-{uuid.uuid4().hex[:12]}"
        f"?verify=false{protocol}&create=true"
    )


@pytest.fixture
def leaks(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], list[str]]]:
    """Record Python warnings and logged errors; yield a function listing the leaks."""
    gc.collect()  # what earlier tests left is not this test's
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.ERROR):
        warnings.simplefilter("always")

        def found() -> list[str]:
            gc.collect()  # an unclosed session warns when it is collected
            texts = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
            texts += [r.getMessage() for r in caplog.records if "Unclosed" in r.getMessage()]
            texts += [str(w.message) for w in caught if "Unclosed" in str(w.message)]
            return texts

        yield found


def _run(coro: Any, what: str) -> Any:
    async def main() -> Any:
        try:
            async with asyncio.timeout(TIMEOUT):
                return await coro
        except TimeoutError:
            raise AssertionError(f"{what} hung for {TIMEOUT:g}s") from None

    return asyncio.run(main())


def test_two_event_loops_each_close_their_client(
    config: str, leaks: Callable[[], list[str]]
) -> None:
    """Two ``asyncio.run`` calls on one open store both work, and neither loop's aio
    client is left unclosed (no ResourceWarning, no "Unclosed client session")."""
    with open_store(config) as store:
        assert isinstance(store, CosmosStore)
        store.save(Checkpoint("loops", state={"n": 1}))

        async def body(n: int) -> Any:
            saved = await store.asave(Checkpoint(f"loop-{n}", state={"n": n}))
            loaded = await store.aload("loops")
            return saved, loaded

        first = _run(body(1), "the first loop's calls")
        assert leaks() == [], "the first loop's client was left open when the loop ended"
        second = _run(body(2), "the second loop's calls")
        assert leaks() == [], "the second loop's client was left open when the loop ended"
        assert first[1] == second[1] == store.load("loops")
        for n in (1, 2):
            loaded = store.load(f"loop-{n}")
            assert loaded is not None and loaded.state == {"n": n}
    assert leaks() == []


def test_two_live_loops_keep_a_client_each(config: str, leaks: Callable[[], list[str]]) -> None:
    """Two loops alive at once, in two threads, each keep their own client through
    interleaved calls: all calls work and no client is dropped unclosed."""
    both = threading.Barrier(2, timeout=TIMEOUT)
    results: dict[int, list[Any]] = {}
    errors: list[BaseException] = []

    with open_store(config) as store:

        async def body(n: int) -> None:
            found = []
            for i in range(3):
                # Both loops call the store between each other's calls.
                await asyncio.to_thread(both.wait)
                await store.asave(Checkpoint(f"live-{n}-{i}", state={"n": n, "i": i}))
                found.append(await store.aload(f"live-{n}-{i}"))
            results[n] = found

        def thread(n: int) -> None:
            try:
                _run(body(n), f"loop {n}'s calls")
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                errors.append(exc)
                both.abort()

        threads = [threading.Thread(target=thread, args=(n,)) for n in (1, 2)]
        for started in threads:
            started.start()
        for joined in threads:
            joined.join(TIMEOUT * 2)
        assert not any(t.is_alive() for t in threads), "a loop's calls hung"
        assert not errors, errors
        for n in (1, 2):
            assert [cp.state for cp in results[n]] == [{"n": n, "i": i} for i in range(3)]
    assert leaks() == [], "a loop's client was dropped unclosed"
