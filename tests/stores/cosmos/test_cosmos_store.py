"""CosmosStore against a real Cosmos DB emulator, plus a fake server for what it cannot do.

The emulator comes from ``tests/cosmos_emulator.py`` (Docker image, node process, or
``STEPSTONE_COSMOS_ENDPOINT``). Without one the emulator tests are skipped loudly, and
fail when ``CI`` is set. Failures the emulator cannot produce (401, 429, a dropped
connection) come from ``_FakeCosmos``, a tiny HTTP server speaking just enough of the
Cosmos REST API, so the real SDK and transport still run end to end.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

pytest.importorskip("azure.cosmos")

import contextlib

from azure.cosmos import CosmosClient

from stepstone import (
    SCHEMA_VERSION,
    Checkpoint,
    CheckpointTooLarge,
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    Step,
    StoreError,
    StorePermissionError,
    StoreUnavailable,
    _hooks,
    open_store,
    run,
    stream,
)
from stepstone._stream import _writer
from stepstone._stream._events import block_id
from stepstone.stores.cosmos import (
    _EXCEPTION_RULES,
    _STATUS_RULES,
    CONTAINER_DEFINITION,
    MAX_ITEM_BYTES,
    CosmosStore,
    _Call,
    item_id,
    sortable_time,
)
from stepstone.stores.cosmos._config import Settings
from stepstone.stores.cosmos._errors import UnexpectedSdkError as _Unexpected

REPO = Path(__file__).resolve().parents[3]
# The emulator runs with a self-signed certificate; verify=false is the documented setting.
pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")

FAKE_KEY = "c3RlcHN0b25lLXRlc3Qta2V5LW5vdC1hLXJlYWwtc2VjcmV0LTEyMzQ1Njc4OTA="


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture
def cosmos_env(emulator: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The emulator, with its key in AZURE_COSMOS_KEY as a deployment would set it."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", emulator.key)
    monkeypatch.delenv("AZURE_COSMOS_CONNECTION_STRING", raising=False)
    return emulator


def _config(emu: Any, database: str, container: str, options: str = "create=true") -> str:
    protocol = "&protocol=http" if emu.endpoint.startswith("http://") else ""
    return f"cosmos://{emu.host}:{emu.port}/{database}/{container}?verify=false{protocol}&{options}"


@pytest.fixture
def config(cosmos_env: Any) -> str:
    """A config string for a fresh container, created on first use."""
    return _config(cosmos_env, "stepstone-test", f"runs-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def store(config: str) -> Iterator[CosmosStore]:
    """A CosmosStore on a fresh container, opened from its config string alone."""
    with open_store(config) as opened:
        assert isinstance(opened, CosmosStore)
        yield opened


def _raw_container(emu: Any, store: CosmosStore) -> Any:
    client = CosmosClient(emu.endpoint, emu.key, **emu.client_kwargs())
    return client.get_database_client(store.database_name).get_container_client(
        store.container_name
    )


def _cp(run_id: str, step: int = 0, state: dict[str, Any] | None = None, **kw: Any) -> Checkpoint:
    names = tuple(f"s{i}" for i in range(step + 1))
    return Checkpoint(run_id=run_id, step=step, state=state or {"n": step}, step_names=names, **kw)


# -- no server needed -----------------------------------------------------------------


def test_container_json_matches_the_code() -> None:
    """backends/cosmos/container.json is exactly the definition the store creates."""
    on_disk = json.loads((REPO / "backends" / "cosmos" / "container.json").read_text())
    assert on_disk == CONTAINER_DEFINITION
    assert on_disk["partitionKey"]["paths"] == ["/id"]
    assert {"path": "/state/*"} in on_disk["indexingPolicy"]["excludedPaths"]
    assert on_disk["indexingPolicy"]["compositeIndexes"][0] == [
        {"path": "/status", "order": "ascending"},
        {"path": "/due_at", "order": "ascending"},
    ]
    assert on_disk["defaultTtl"] == -1


def _bicep_value(tokens: list[str], at: int) -> tuple[Any, int]:
    """Parse one Bicep value (object, array, string, number, bool, reference) at ``at``."""
    token = tokens[at]
    if token == "{":
        obj: dict[str, Any] = {}
        at += 1
        while tokens[at] != "}":
            key, colon = tokens[at], tokens[at + 1]
            assert colon == ":", (key, colon)
            obj[key], at = _bicep_value(tokens, at + 2)
        return obj, at + 1
    if token == "[":
        items: list[Any] = []
        at += 1
        while tokens[at] != "]":
            item, at = _bicep_value(tokens, at)
            items.append(item)
        return items, at + 1
    if token.startswith("'"):
        return token[1:-1], at + 1
    if token in ("true", "false"):
        return token == "true", at + 1
    if re.fullmatch(r"-?\d+", token):
        return int(token), at + 1
    return ("ref", token), at + 1  # a parameter or variable reference


def _bicep_container_resource() -> dict[str, Any]:
    """The ``resource: {...}`` object of main.bicep's container, parsed."""
    bicep = (REPO / "backends" / "cosmos" / "main.bicep").read_text()
    block = bicep[bicep.index("resource container ") :]
    block = block[block.index("resource: {") + len("resource: ") :]
    block = re.sub(r"//[^\n]*", "", block)
    tokens = re.findall(r"'[^']*'|[{}\[\]:]|[^\s{}\[\]:']+", block)
    value, _ = _bicep_value(tokens, 0)
    assert isinstance(value, dict)
    return value


def test_bicep_declares_the_same_container() -> None:
    """main.bicep's container has the code's partition key, indexing policy and TTL."""
    resource = _bicep_container_resource()
    assert resource["partitionKey"] == CONTAINER_DEFINITION["partitionKey"]
    assert resource["indexingPolicy"] == CONTAINER_DEFINITION["indexingPolicy"]
    assert resource["defaultTtl"] == CONTAINER_DEFINITION["defaultTtl"]
    bicep = (REPO / "backends" / "cosmos" / "main.bicep").read_text()
    assert "00000000-0000-0000-0000-000000000002" in bicep  # the data-plane role


def test_capabilities_are_declared() -> None:
    """CosmosStore declares its kill points, request counting, TTL and native async."""
    assert dict(CosmosStore.kill_points) == {
        "cosmos.before_request": False,
        "cosmos.request_sent": True,
    }
    assert CosmosStore.counts_requests and CosmosStore.supports_ttl and CosmosStore.native_async
    assert CosmosStore.durability_levels == () and CosmosStore.durable


@pytest.mark.parametrize(
    ("run_id", "form"),
    [
        ("plain-Run_1.2:3", "verbatim"),
        ("x" * 200, "verbatim"),
        ("x" * 201, "hash"),
        ("y/" * 90, "base64"),
        ("a/b", "base64"),
        ("a\\b#c?d%e", "base64"),
        ("~tilde", "base64"),
        ("!bang", "base64"),
        ("..", "base64"),
        ("with space", "base64"),
        ("x" * 1024, "hash"),
        ("é" * 1024, "hash"),
        ("/" * 1024, "hash"),
    ],
)
def test_item_id_forms(run_id: str, form: str) -> None:
    """Every run_id maps to a legal Cosmos id of the documented form."""
    encoded = item_id(run_id)
    assert len(encoded) <= 255
    assert not set(encoded) & set("/\\#?")
    expected = {"verbatim": run_id[:1], "base64": "~", "hash": "!"}[form]
    assert encoded[0] == expected
    if form == "verbatim":
        assert encoded == run_id


def test_item_ids_never_collide() -> None:
    """Ids differing only by case, encoding or length get distinct items."""
    ids = ["a/b", "a/B", "A/b", "~YS9i", "!x", "a%2Fb", "a%2fb", "x" * 1024, "x" * 1023, "X" * 1024]
    ids += ["a" * 186 + "/", "a" * 187 + "/", "a" * 188 + "/"]  # around the base64/hash edge
    encoded = [item_id(i) for i in ids]
    assert len(set(encoded)) == len(ids)


def test_item_size_is_what_the_sdk_sends() -> None:
    """The pre-request size equals the UTF-8 length of the SDK's JSON body, non-ASCII too."""
    store = CosmosStore("https://example.invalid/", "db", "c", credential=FAKE_KEY, ttl=60)
    for state in ({"a": 1}, {"é": "日本語", "rocket": "\U0001f680", "ctl": "\n\t\x01"}):
        cp = _cp("r/1", state=state)
        text = json.dumps(state, ensure_ascii=False, separators=(",", ":"))
        item, size = store._item(cp, item_id(cp.run_id), text)
        assert size == len(json.dumps(item, separators=(",", ":")).encode("utf-8"))
        assert item["ttl"] == 60


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ("cosmos://h/db/c?key=SECRETVALUE", "AZURE_COSMOS_KEY"),
        ("cosmos://h/db/c?AccountKey=SECRETVALUE", "AZURE_COSMOS_KEY"),
        ("cosmos://user:SECRETVALUE@h/db/c", "AZURE_COSMOS_KEY"),
        ("cosmos://h/db/c?colour=blue", "known options: auth, connect_timeout, consistency"),
        ("cosmos://h/db/c?connect_timeout=-1", "connect_timeout"),
        ("cosmos://h/db/c?read_timeout=soon", "read_timeout"),
        ("cosmos://h/db", "/DATABASE/CONTAINER"),
        ("cosmos://h/db/c/extra", "/DATABASE/CONTAINER"),
        ("cosmos:///db/c", "missing account host"),
        ("cosmos://h/db/c?retries=many", "retries"),
        ("cosmos://h/db/c?timeout=0", "timeout"),
        ("cosmos://h/db/c?ttl=0", "ttl"),
        ("cosmos://h/db/c?verify=maybe", "verify"),
        ("cosmos://h/db/c?consistency=Strongest", "consistency"),
    ],
)
def test_bad_config_strings(config: str, fragment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Malformed strings raise ConfigError naming the problem, never echoing a secret."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    with pytest.raises(ConfigError) as info:
        open_store(config)
    assert fragment in str(info.value)
    assert "SECRETVALUE" not in str(info.value)


def test_missing_credentials_explain_the_three_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    """auth=key without AZURE_COSMOS_KEY says how to give credentials."""
    monkeypatch.delenv("AZURE_COSMOS_KEY", raising=False)
    with pytest.raises(StorePermissionError) as info:
        open_store("cosmos://h/db/c?auth=key")
    message = str(info.value)
    for way in ("AZURE_COSMOS_KEY", "AZURE_COSMOS_CONNECTION_STRING", "Entra ID"):
        assert way in message
    assert len(message) < 300, len(message)
    monkeypatch.delenv("AZURE_COSMOS_CONNECTION_STRING", raising=False)
    with pytest.raises(StorePermissionError) as info:
        open_store("cosmos://h/db/c?auth=connection-string")
    assert "AZURE_COSMOS_CONNECTION_STRING" in str(info.value) and len(str(info.value)) < 300


def test_auth_defaults_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default auth is the key, then the connection string, then Entra ID."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    assert CosmosStore.from_config("cosmos://h/db/c").auth == "key"
    monkeypatch.delenv("AZURE_COSMOS_KEY")
    monkeypatch.setenv(
        "AZURE_COSMOS_CONNECTION_STRING", f"AccountEndpoint=https://h:443/;AccountKey={FAKE_KEY};"
    )
    assert CosmosStore.from_config("cosmos://h/db/c").auth == "connection-string"
    with pytest.raises(ConfigError, match="is for https://other"):
        monkeypatch.setenv(
            "AZURE_COSMOS_CONNECTION_STRING",
            f"AccountEndpoint=https://other/;AccountKey={FAKE_KEY}",
        )
        CosmosStore.from_config("cosmos://h/db/c")
    monkeypatch.delenv("AZURE_COSMOS_CONNECTION_STRING")
    assert CosmosStore.from_config("cosmos://h/db/c").auth == "entra"


def test_from_config_passes_every_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each option of the config string reaches the store's settings unchanged."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    store = CosmosStore.from_config(
        "cosmos://h:8081/db/c?protocol=http&verify=false&create=true&consistency=Eventual"
        "&retries=2&timeout=7&connect_timeout=3&read_timeout=4&ttl=90"
    )
    assert store.settings == Settings(
        "http://h:8081/",
        "db",
        "c",
        auth="key",
        verify=False,
        create=True,
        consistency="Eventual",
        retries=2,
        timeout=7.0,
        connect_timeout=3.0,
        read_timeout=4.0,
        ttl=90,
    )


def test_repr_has_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """repr shows endpoint, database, container and auth kind, never the key."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    store = open_store("cosmos://acct.documents.azure.com/db/runs")
    text = repr(store)
    assert FAKE_KEY not in text
    assert "https://acct.documents.azure.com/" in text and "'db'" in text and "'runs'" in text


def test_connection_refused_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listening maps to StoreUnavailable."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    with (
        open_store("cosmos://127.0.0.1:1/db/c?retries=0") as store,
        pytest.raises(StoreUnavailable, match="cannot connect"),
    ):
        store.load("x")


# -- a fake Cosmos endpoint for failures the emulator cannot produce ------------------


#: Answers of a broken proxy or a server dying mid-answer, by ``_FakeCosmos`` behaviour.
_GARBLED: dict[str, bytes] = {
    "not-utf8": b'\xff\xfe{"id": "x"',
    "not-json": b"<html>502 Bad Gateway</html>",
    "array": b"[1, 2, 3]",
    "scalar": b"42",
    "short": b'{"id": "x", "run_id"',
}


class _FakeCosmos:
    """Answers the account and container reads like Cosmos; item calls per ``behaviour``."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.item_requests: list[str] = []
        self.auth_headers: list[str] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: dict[str, Any], **headers: str) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name.replace("_", "-"), value)
                self.end_headers()
                self.wfile.write(data)

            def _garble(self, body: bytes) -> None:
                # A 200 whose body is not what Cosmos sends; "short" promises more bytes
                # than it sends, then hangs up.
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                short = fake.behaviour == "short"
                self.send_header("Content-Length", str(len(body) + (1000 if short else 0)))
                self.end_headers()
                self.wfile.write(body)
                if short:
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(2)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                fake.auth_headers.append(self.headers.get("authorization", ""))
                endpoint = f"http://127.0.0.1:{fake.port}/"
                if fake.behaviour == "401":
                    self._reply(
                        401,
                        {
                            "code": "Unauthorized",
                            "message": "The input authorization token "
                            "can't serve the request. The wrong key is being used.",
                        },
                    )
                    return
                if self.path == "/":
                    location = [{"name": "Local", "databaseAccountEndpoint": endpoint}]
                    self._reply(
                        200,
                        {
                            "id": "fake",
                            "_rid": "fake",
                            "writableLocations": location,
                            "readableLocations": location,
                            "enableMultipleWriteLocations": False,
                            "userConsistencyPolicy": {"defaultConsistencyLevel": "Session"},
                            "queryEngineConfiguration": "{}",
                        },
                    )
                    return
                if self.path.rstrip("/") == "/dbs/db/colls/c":
                    self._reply(
                        200,
                        {
                            "id": "c",
                            "_rid": "AAAAAA==",
                            "_self": "dbs/AAAA==/colls/AAAAAA==/",
                            "partitionKey": {"paths": ["/id"], "kind": "Hash", "version": 2},
                        },
                    )
                    return
                fake.item_requests.append(f"{self.command} {self.path}")
                if fake.behaviour == "429":
                    self._reply(
                        429,
                        {"code": "TooManyRequests", "message": "Request rate is large"},
                        x_ms_retry_after_ms="1",
                    )
                elif fake.behaviour == "drop":
                    self.close_connection = True
                    self.connection.shutdown(2)
                elif fake.behaviour in _GARBLED:
                    self._garble(_GARBLED[fake.behaviour])
                else:
                    self._reply(500, {"code": "InternalServerError", "message": "boom"})

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _FakeCosmos:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def config(self, retries: int = 2) -> str:
        return f"cosmos://127.0.0.1:{self.port}/db/c?protocol=http&retries={retries}"


def test_wrong_key_is_a_permission_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 401 from the account becomes StorePermissionError naming the account, not the key."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    with (
        _FakeCosmos("401") as fake,
        open_store(fake.config()) as store,
        pytest.raises(StorePermissionError) as info,
    ):
        store.load("x")
    message = str(info.value)
    assert "'127.0.0.1'" in message and "refused the key credentials" in message
    assert FAKE_KEY not in message and FAKE_KEY not in repr(store)
    assert fake.auth_headers and all(FAKE_KEY not in h for h in fake.auth_headers)


def test_throttling_is_retried_then_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """429 is retried exactly ``retries`` times by the SDK, then StoreUnavailable(429)."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    with _FakeCosmos("429") as fake, open_store(fake.config()) as store:
        assert isinstance(store, CosmosStore)
        with pytest.raises(StoreUnavailable) as info:
            store.load("x")
        assert info.value.status == 429
        assert len(fake.item_requests) == 3  # 1 + retries=2
        before = store.requests_sent
        with pytest.raises(StoreUnavailable):
            store.save(_cp("x"))
        assert store.requests_sent - before == 3
        assert [r.split()[0] for r in fake.item_requests[3:]] == ["POST"] * 3


def test_write_is_not_retried_after_a_dropped_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A save whose connection drops is sent once and reported as possibly applied."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    with _FakeCosmos("drop") as fake, open_store(fake.config(retries=5)) as store:
        with pytest.raises(StoreUnavailable, match="may or may not have been applied"):
            store.save(_cp("x"))
        assert [r.split()[0] for r in fake.item_requests] == ["POST"]


def test_server_errors_are_unavailable_with_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 500 on a write surfaces as StoreUnavailable carrying the status code."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    with _FakeCosmos("500") as fake, open_store(fake.config()) as store:
        with pytest.raises(StoreUnavailable) as info:
            store.save(_cp("x"))
        assert info.value.status == 500
        assert [r.split()[0] for r in fake.item_requests] == ["POST"]


# -- against the emulator ---------------------------------------------------------------


def test_round_trip_and_versions(store: CosmosStore) -> None:
    """A saved checkpoint loads back equal, with the item's _etag as its version."""
    assert store.load("r1") is None
    first = store.save(_cp("r1", total_steps=3))
    assert first.version and first.state_json == '{"n":0}'
    state = {"é": "日本", "x": [1.5, None]}
    second = store.save(
        _cp("r1", step=1, state=state, version=first.version, created_at=first.created_at)
    )
    assert second.version != first.version
    loaded = store.load("r1")
    assert loaded == second and loaded is not None and loaded.created_at == first.created_at


def test_awkward_ids_round_trip_without_colliding(store: CosmosStore) -> None:
    """Ids with / \\ # ? %, case variants and 1024 characters each keep their own item."""
    ids = [
        "a/b",
        "A/b",
        "a/B",
        "a\\b",
        "#frag",
        "?q=1",
        "%2F",
        "a%2fb",
        "~tilde",
        "!bang",
        ".",
        "..",
        "with space",
        "日本語",
        "x" * 1024,
        "X" * 1024,
        "é" * 1024,
        "/" * 1024,
    ]
    for index, run_id in enumerate(ids):
        store.save(_cp(run_id, state={"i": index}))
    for index, run_id in enumerate(ids):
        loaded = store.load(run_id)
        assert loaded is not None and loaded.run_id == run_id and loaded.state == {"i": index}
    assert sorted(store.list_runs()) == sorted(ids)
    assert store.delete("a/B") and store.load("a/B") is None and store.load("a/b") is not None


def test_exactly_one_request_per_save_and_load(store: CosmosStore) -> None:
    """After opening, each load and each save sends exactly one HTTP request."""
    store.load("warm-up")  # opens: account read, create, container read
    counts = []
    before = store.requests_sent
    cp = store.save(_cp("one", total_steps=5))
    counts.append(store.requests_sent - before)
    for step in range(1, 4):
        before = store.requests_sent
        cp = store.save(_cp("one", step=step, version=cp.version, total_steps=5))
        counts.append(store.requests_sent - before)
        before = store.requests_sent
        assert store.load("one") == cp
        counts.append(store.requests_sent - before)
    before = store.requests_sent
    assert store.load("missing") is None
    counts.append(store.requests_sent - before)
    assert counts == [1] * len(counts)


def test_create_conflict_is_conflict_error(store: CosmosStore) -> None:
    """A first save when the run already exists (409) raises ConflictError and stores nothing."""
    kept = store.save(_cp("c1", state={"v": 1}))
    with pytest.raises(ConflictError) as info:
        store.save(_cp("c1", state={"v": 2}))
    assert info.value.run_id == "c1"
    assert isinstance(info.value.__cause__, Exception)
    assert store.load("c1") == kept


def test_stale_version_is_conflict_error(store: CosmosStore) -> None:
    """A save with an old ETag (412) raises ConflictError and stores nothing."""
    first = store.save(_cp("c2"))
    second = store.save(_cp("c2", step=1, version=first.version))
    with pytest.raises(ConflictError, match="412"):
        store.save(_cp("c2", step=1, state={"lost": True}, version=first.version))
    store.delete("c2")
    with pytest.raises(ConflictError, match="deleted"):
        store.save(_cp("c2", step=2, version=second.version))
    assert store.load("c2") is None


def test_oversized_checkpoint_is_refused_before_any_request(store: CosmosStore) -> None:
    """An item over 2 MB (its input: a long state goes to pieces): CheckpointTooLarge with
    size and limit, no request, stored item unchanged."""
    kept = store.save(_cp("big"))
    events: list[str] = []
    _hooks.install(events.append)
    try:
        before = store.requests_sent
        with pytest.raises(CheckpointTooLarge) as info:
            store.save(
                _cp("big", step=1, input={"blob": "x" * MAX_ITEM_BYTES}, version=kept.version)
            )
        assert store.requests_sent == before
    finally:
        _hooks.install(None)
    assert events == []
    assert info.value.limit == MAX_ITEM_BYTES and info.value.size > MAX_ITEM_BYTES
    assert f"{info.value.size:,}" in str(info.value) and f"{MAX_ITEM_BYTES:,}" in str(info.value)
    assert store.load("big") == kept
    # Just under the limit is accepted by the service: the client check is not too strict.
    fits = MAX_ITEM_BYTES - 2000
    store.save(_cp("big", step=1, input={"blob": "y" * fits}, version=kept.version))


def test_save_fires_both_hooks_in_order(store: CosmosStore) -> None:
    """A save fires cosmos.before_request then cosmos.request_sent; a load fires neither."""
    store.load("warm-up")
    events: list[str] = []
    _hooks.install(events.append)
    try:
        store.save(_cp("hooked"))
        store.load("hooked")
    finally:
        _hooks.install(None)
    assert events == ["cosmos.before_request", "cosmos.request_sent"]


def test_missing_database_is_named(cosmos_env: Any) -> None:
    """Without create=true a missing database is a StoreError naming it and `stepstone init`."""
    name = f"nodb-{uuid.uuid4().hex[:8]}"
    config = _config(cosmos_env, name, "runs", "create=false")
    with open_store(config) as store, pytest.raises(StoreError) as info:
        store.load("x")
    assert f"database {name!r} does not exist" in str(info.value)
    assert "stepstone init" in str(info.value) and "create=true" in str(info.value)


def test_missing_container_is_named(store: CosmosStore, cosmos_env: Any) -> None:
    """Without create=true a missing container (database present) is named as such."""
    store.load("x")  # creates the database
    config = _config(cosmos_env, store.database_name, "nothere", "create=false")
    with open_store(config) as other, pytest.raises(StoreError) as info:
        other.load("x")
    assert "container 'nothere' does not exist in database" in str(info.value)


def test_create_true_builds_the_documented_container(store: CosmosStore, cosmos_env: Any) -> None:
    """create=true creates the container with partition key /id, state unindexed, TTL on."""
    store.load("x")
    properties = _raw_container(cosmos_env, store).read()
    assert properties["partitionKey"]["paths"] == ["/id"]
    assert properties["defaultTtl"] == -1
    assert {"path": "/state/*"} in properties["indexingPolicy"]["excludedPaths"]


def test_init_creates_then_finds(cosmos_env: Any) -> None:
    """init() creates database and container, and a second init reports them found."""
    config = _config(cosmos_env, f"initdb-{uuid.uuid4().hex[:8]}", "runs", "create=false")
    with open_store(config) as store:
        first = store.init()
        second = store.init()
        assert store.load("x") is None
    assert any("created" in line for line in first) and len(first) == 2
    assert all("already exists" in line for line in second)


def test_wrong_partition_key_is_refused(store: CosmosStore, cosmos_env: Any) -> None:
    """A container partitioned by anything but /id is refused, and doctor says why."""
    from azure.cosmos import PartitionKey

    store.load("x")
    name = f"badpk-{uuid.uuid4().hex[:8]}"
    client = CosmosClient(cosmos_env.endpoint, cosmos_env.key, **cosmos_env.client_kwargs())
    client.get_database_client(store.database_name).create_container(
        name, partition_key=PartitionKey(path="/tenant")
    )
    config = _config(cosmos_env, store.database_name, name, "create=false")
    with open_store(config) as other:
        with pytest.raises(StoreError, match="partitioned by"):
            other.load("x")
        checks = other.doctor()
    assert not checks[0].ok and "partitioned by" in checks[0].detail


def test_doctor_checks_partition_key_and_schema(store: CosmosStore) -> None:
    """doctor passes on a healthy container and reports the partition key and schema checks."""
    store.save(_cp("d1"))
    checks = {c.check: c for c in store.doctor()}
    assert checks["partition key is /id"].ok
    assert checks[f"checkpoint schema {SCHEMA_VERSION}"].ok
    assert checks["claim index (status, due_at)"].ok
    assert all(c.ok for c in checks.values()), checks


def test_foreign_or_mismatched_items_are_corrupt(store: CosmosStore, cosmos_env: Any) -> None:
    """An item whose run_id differs, or without the schema key, raises CorruptCheckpoint."""
    store.load("x")
    raw = _raw_container(cosmos_env, store)
    doc = {
        "id": item_id("a/b"),
        "stepstone": 1,
        "run_id": "someone-else",
        "step": -1,
        "step_names": [],
        "state": {},
    }
    raw.create_item(doc)
    with pytest.raises(CorruptCheckpoint, match="holds run 'someone-else'"):
        store.load("a/b")
    raw.create_item({"id": "foreign", "hello": "world"})
    with pytest.raises(CorruptCheckpoint, match="schema"):
        store.load("foreign")
    assert any(not c.ok for c in store.doctor() if c.check.startswith("checkpoint schema"))


def test_expire_sets_native_ttl(store: CosmosStore, cosmos_env: Any) -> None:
    """expire() writes the per-item ttl with a conditional replace; None removes it."""
    cp = store.save(_cp("old/run", total_steps=1))
    assert store.expire("old/run", 3600)
    raw = _raw_container(cosmos_env, store)
    doc = raw.read_item(item_id("old/run"), partition_key=item_id("old/run"))
    assert doc["ttl"] == 3600
    loaded = store.load("old/run")
    assert loaded is not None and loaded.state == cp.state and loaded.version != cp.version
    assert store.expire("old/run", None)
    assert "ttl" not in raw.read_item(item_id("old/run"), partition_key=item_id("old/run"))
    assert store.expire("never/saved", 60) is False


def test_ttl_option_is_written_on_every_save(cosmos_env: Any, config: str) -> None:
    """With ttl=N in the config string every saved item carries ttl N."""
    with open_store(config + "&ttl=86400") as store:
        assert isinstance(store, CosmosStore)
        store.save(_cp("t"))
        raw = _raw_container(cosmos_env, store)
        assert raw.read_item(item_id("t"), partition_key=item_id("t"))["ttl"] == 86400


def test_ttl_option_keeps_a_streams_blocks_until_the_run_rests(
    cosmos_env: Any, config: str
) -> None:
    """With ttl=N a block waits (-1) while its run is active, then gets N when it rests.

    Under N alone an early block would expire while a long run, rewritten at every step,
    is still active, and its stream would lose its start (issue 34).
    """
    with open_store(config + "&ttl=86400") as store:
        assert isinstance(store, CosmosStore)
        raw = _raw_container(cosmos_env, store)

        def ttl_of(record_id: str) -> Any:
            return raw.read_item(item_id(record_id), partition_key=item_id(record_id)).get("ttl")

        while_active: list[Any] = []

        def talk(state: dict[str, Any], ctx: Any) -> None:
            ctx.emit("tokens", "first")
            _writer.current.get().writer.flush()  # type: ignore[union-attr]
            while_active.append(ttl_of(block_id("ttl-stream", 0)))
            ctx.emit("tokens", "second")

        run("ttl-stream", [Step("talk", talk)], store)
        assert while_active == [-1]
        assert [ttl_of(block_id("ttl-stream", n)) for n in (0, 1)] == [86400, 86400]
        assert ttl_of("ttl-stream") == 86400
        assert [e.data for e in stream(store, "ttl-stream")] == ["first", "second"]


def _piece_ttls(raw: Any, run_id: str) -> dict[str, Any]:
    rows = raw.query_items(
        "SELECT c.key, c.ttl FROM c WHERE c.piece_of = @of",
        parameters=[{"name": "@of", "value": item_id(run_id)}],
        enable_cross_partition_query=True,
    )
    return {row["key"]: row.get("ttl") for row in rows}


def test_ttl_pieces_outlive_the_item_that_names_them(
    cosmos_env: Any, config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ttl=N: pieces get 2N, and a base older than N/2 is rewritten, never logged against.

    So every piece an item names expires at least N/2 after that item does.
    """
    from stepstone import _statelog

    with open_store(config + "&ttl=600") as store:
        assert isinstance(store, CosmosStore)
        raw = _raw_container(cosmos_env, store)
        cp = store.save(_cp("long", state={"log": ["x" * 5000, "y" * 5000]}))
        cp = store.save(
            replace(
                cp, step=1, step_names=("s0", "s1"), state={"log": [*cp.state["log"], "z" * 100]}
            )
        )
        ttls = _piece_ttls(raw, "long")
        handle = cp.stored_state
        assert handle is not None and handle.ref is not None
        assert sorted(ttls) == sorted(_statelog.pieces_of(handle.ref))
        assert set(ttls.values()) == {1200}
        assert len(handle.ref["log"]) == 1  # the second save logged its change
        base = list(handle.ref["base"])
        now = time.time()
        monkeypatch.setattr(time, "time", lambda: now + 301)
        cp = store.save(
            replace(
                cp,
                step=2,
                step_names=("s0", "s1", "s2"),
                state={"log": [*cp.state["log"], "w" * 100]},
            )
        )
        handle = cp.stored_state
        assert handle is not None and handle.ref is not None
        assert handle.ref["log"] == [] and handle.ref["base"] != base  # rewritten whole
        assert sorted(_piece_ttls(raw, "long")) == sorted(handle.ref["base"])
        assert store.load("long") == cp
        # expire(): the item gets the ttl, its pieces twice it, after the item.
        assert store.expire("long", 60)
        assert set(_piece_ttls(raw, "long").values()) == {120}
        assert raw.read_item(item_id("long"), partition_key=item_id("long"))["ttl"] == 60
        assert store.expire("long", -1)
        assert set(_piece_ttls(raw, "long").values()) == {-1}
        loaded = store.load("long")
        assert loaded is not None and loaded.state == cp.state


def test_list_info_reads_status_without_states(store: CosmosStore) -> None:
    """list_info reports each run's status from one query."""
    from stepstone import Failure
    from stepstone._checkpoint import utcnow

    store.save(_cp("done", step=0, total_steps=1))
    store.save(_cp("running", step=0, total_steps=3))
    failure = Failure(1, "s1", "ValueError", "bad", 1, utcnow())
    store.save(_cp("failed", step=0, total_steps=3, failure=failure))
    before = store.requests_sent
    infos = {i.run_id: i for i in store.list_info()}
    assert store.requests_sent - before == 1
    assert {k: v.status for k, v in infos.items()} == {
        "done": "done",
        "running": "running",
        "failed": "failed",
    }


def test_connection_string_auth_works(cosmos_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """AZURE_COSMOS_CONNECTION_STRING alone is enough to open the store."""
    monkeypatch.delenv("AZURE_COSMOS_KEY")
    monkeypatch.setenv(
        "AZURE_COSMOS_CONNECTION_STRING",
        f"AccountEndpoint={cosmos_env.endpoint};AccountKey={cosmos_env.key};",
    )
    config = _config(cosmos_env, "stepstone-test", f"cs-{uuid.uuid4().hex[:8]}")
    with open_store(config) as store:
        assert isinstance(store, CosmosStore) and store.auth == "connection-string"
        store.save(_cp("cs"))
        assert store.load("cs") is not None


# -- shared helpers for the tests below ---------------------------------------------------


def _arun(coro: Any, what: str = "the async store calls", timeout: float = 60.0) -> Any:
    """Run ``coro`` in a fresh event loop, failing with ``what`` if it hangs."""

    async def main() -> Any:
        try:
            async with asyncio.timeout(timeout):
                return await coro
        except TimeoutError:
            raise AssertionError(f"{what} hung for {timeout:g}s") from None

    return asyncio.run(main())


def _now() -> Any:
    from stepstone._checkpoint import utcnow

    return utcnow()


def _runtime_cp(run_id: str, **kw: Any) -> Checkpoint:
    """A checkpoint using every schema-2 field, with numbers Cosmos could not keep."""
    from stepstone._checkpoint import Signal

    at = _now()
    fields: dict[str, Any] = {
        "input": {"big": 2**63 + 1, "float": 1.0, "neg0": -0.0, "text": "é"},
        "workflow": "wf",
        "workflow_version": "3",
        "owner": "worker-1",
        "epoch": 7,
        "lease": 30.0,
        "renewed_at": at,
        "signals": (Signal("approve", "sig-1", {"n": 2**60 + 3}, at),),
        "consumed": {"approve": 0},
        "parent": "parent/run",
        "cancel_requested": True,
    }
    fields.update(kw)
    return _cp(run_id, state={"big": 2**64 + 7}, total_steps=5, **fields)


# -- error translation, as tables ---------------------------------------------------------

_TABLE_CASES = [
    (401, None, StorePermissionError),
    (403, None, StorePermissionError),
    (404, 1003, StoreError),
    (404, None, StoreError),
    (408, None, StoreUnavailable),
    (409, None, ConflictError),
    (412, None, ConflictError),
    (413, None, CheckpointTooLarge),
    (429, None, StoreUnavailable),
    (449, None, StoreUnavailable),
    (500, None, StoreUnavailable),
    (502, None, StoreUnavailable),
    (503, None, StoreUnavailable),
    (504, None, StoreUnavailable),
]


def test_status_table_is_fully_tested() -> None:
    """Every row of the status table has a case below, so no row goes unchecked."""
    assert {(status, sub) for status, sub, _ in _TABLE_CASES} == set(_STATUS_RULES)


@pytest.mark.parametrize(
    ("status", "sub_status", "expected"),
    [*_TABLE_CASES, (400, None, StoreError), (507, None, StoreUnavailable)],
)
def test_status_codes_map_to_stepstone_errors(
    status: int, sub_status: int | None, expected: type[Exception]
) -> None:
    """Each HTTP status (and sub-status) becomes its stepstone error, with no secret."""
    from azure.cosmos.exceptions import CosmosHttpResponseError

    store = CosmosStore("https://acct.example/", "db", "c", credential=FAKE_KEY)
    cause = CosmosHttpResponseError(  # type: ignore[no-untyped-call]
        status_code=status, message=f"boom AccountKey={FAKE_KEY};", sub_status=sub_status
    )
    with pytest.raises(StoreError) as info, store._translate(_Call("save", "r/1", 10)):
        raise cause
    error = info.value
    assert type(error) is expected
    assert error.__cause__ is cause
    assert FAKE_KEY not in str(error)
    if isinstance(error, ConflictError):
        assert error.run_id == "r/1"
    if isinstance(error, StoreUnavailable):
        assert error.status == status
    if status == 412:
        assert "nothing was stored" in str(error)
    if status == 404 and sub_status == 1003:
        assert "no longer exists" in str(error)


def test_precondition_failed_on_delete_says_nothing_was_deleted() -> None:
    """The 412 message follows the action: a stale delete says nothing was deleted."""
    from azure.cosmos.exceptions import CosmosHttpResponseError

    store = CosmosStore("https://acct.example/", "db", "c", credential=FAKE_KEY)
    with (
        pytest.raises(ConflictError, match="nothing was deleted"),
        store._translate(_Call("delete", "r")),
    ):
        raise CosmosHttpResponseError(status_code=412, message="mismatch")  # type: ignore[no-untyped-call]


def test_exception_rules_map_transport_failures() -> None:
    """Transport, timeout and credential failures map by the exception table."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        ServiceRequestError,
        ServiceRequestTimeoutError,
        ServiceResponseError,
        ServiceResponseTimeoutError,
    )
    from azure.cosmos.exceptions import CosmosClientTimeoutError

    store = CosmosStore("https://127.0.0.1:1/", "db", "c", credential=FAKE_KEY)
    cases: list[tuple[BaseException, type[Exception], str]] = [
        (CosmosClientTimeoutError(), StoreUnavailable, "timed out after 60s"),  # type: ignore[no-untyped-call]
        (ServiceRequestTimeoutError("slow"), StoreUnavailable, "could not connect within 5s"),
        (ServiceRequestError("refused"), StoreUnavailable, "nothing was sent"),
        (ServiceResponseTimeoutError("late"), StoreUnavailable, "no answer within 30s"),
        (ServiceResponseError("reset"), StoreUnavailable, "may or may not have been applied"),
        (TimeoutError(), StoreUnavailable, "timed out"),
        (ClientAuthenticationError("x" * 1000), StorePermissionError, "AZURE_COSMOS_KEY"),
    ]
    assert {type(exc) for exc, _, _ in cases} >= {
        kind
        for rule in _EXCEPTION_RULES
        for kind in rule.types
        if kind.__module__.startswith("azure.") and kind.__name__ != "AzureError"
    }
    for cause, expected, fragment in cases:
        with pytest.raises(StoreError) as info, store._translate(_Call("save", "r")):
            raise cause
        assert type(info.value) is expected, cause
        assert fragment in str(info.value), (cause, str(info.value))
        assert info.value.__cause__ is cause
    # A programming error is not a store error: it propagates untouched.
    with pytest.raises(KeyError), store._translate(_Call("load", "r")):
        raise KeyError("bug")


def test_entra_failure_message_is_short() -> None:
    """A failed credential chain gives < 300 characters naming what to set, not the chain."""
    from azure.core.exceptions import ClientAuthenticationError

    store = CosmosStore("https://acct.documents.azure.com/", "db", "c", auth="entra")
    chain = "DefaultAzureCredential failed to retrieve a token. " + "Attempted x. " * 80
    with pytest.raises(StorePermissionError) as info, store._translate(_Call("connect")):
        raise ClientAuthenticationError(chain)
    message = str(info.value)
    assert len(message) < 300, len(message)
    for needed in ("AZURE_COSMOS_KEY", "AZURE_COSMOS_CONNECTION_STRING", "az login"):
        assert needed in message
    assert "Attempted" not in message and chain in str(info.value.__cause__)


def test_untrusted_certificate_hints_at_the_fix() -> None:
    """A certificate verification failure names REQUESTS_CA_BUNDLE and verify=false."""
    from azure.core.exceptions import ServiceRequestError

    store = CosmosStore("https://localhost:8081/", "db", "c", credential=FAKE_KEY)
    cause = ServiceRequestError(
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate"
    )
    with pytest.raises(StoreUnavailable) as info, store._translate(_Call("connect")):
        raise cause
    assert "REQUESTS_CA_BUNDLE" in str(info.value) and "verify=false" in str(info.value)


# -- item layout -----------------------------------------------------------------------


def test_sortable_time_orders_as_instants() -> None:
    """due_at text sorts exactly as the instants do, whatever the input's time zone."""
    from datetime import UTC, datetime, timedelta, timezone

    base = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    instants = [
        (base + timedelta(microseconds=n * 7919)).astimezone(timezone(timedelta(hours=n % 5)))
        for n in range(-50, 50)
    ]
    texts = [sortable_time(t) for t in instants]
    assert sorted(texts) == [sortable_time(t) for t in sorted(instants)]
    assert all(len(t) == len(texts[0]) and t.endswith("Z") for t in texts)
    assert datetime.fromisoformat(texts[0]) == instants[0]
    with pytest.raises(ValueError, match="time zone"):
        sortable_time(datetime(2026, 1, 1))


def test_item_carries_listing_fields_and_round_trips_exactly() -> None:
    """status, due_at and owner sit beside the state text; big numbers survive exactly."""
    store = CosmosStore("https://example.invalid/", "db", "c", credential=FAKE_KEY)
    cp = _runtime_cp("r/x")
    plan = store._plan(cp)
    item = plan.item
    assert item["status"] == "running" and item["owner"] == "worker-1"
    assert item["due_at"] == sortable_time(plan.now.__class__.fromisoformat(item["due_at"]))
    assert isinstance(item["state"], str) and isinstance(item["input"], str)
    assert isinstance(item["signals"], str)
    stored = store._saved(plan, cp, {"_etag": '"e1"'})
    loaded = store._checkpoint({**json.loads(json.dumps(item)), "_etag": '"e1"'}, "r/x")
    assert loaded == stored
    assert loaded.input == cp.input and loaded.signals == cp.signals
    assert loaded.state["big"] == 2**64 + 7 and loaded.due_at == stored.due_at


# -- hung and unreachable servers -------------------------------------------------------


class _SilentServer:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)  # so the accept loop sees ``stop``
        self.stop = threading.Event()
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(conn)

    def __enter__(self) -> _SilentServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()
        for conn in self.conns:
            conn.close()
        assert not self.thread.is_alive(), "the silent server's accept thread hung"


_HUNG = "connect_timeout=0.5&read_timeout=0.5&retries=0&timeout=4"


@pytest.mark.parametrize("protocol", ["http", "https"])
def test_silent_server_times_out_sync_and_async(
    protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that accepts and never answers gives StoreUnavailable within the timeouts."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    with _SilentServer() as server:
        config = f"cosmos://127.0.0.1:{server.port}/db/c?protocol={protocol}&{_HUNG}"
        store = open_store(config)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            store.load("x")
        assert time.monotonic() - started < 15, "sync load outlived timeout=4"
        assert FAKE_KEY not in str(info.value)

        async def body() -> None:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await store.aload("x")
            assert time.monotonic() - started < 15, "async load outlived timeout=4"
            await store.aclose()

        _arun(body(), "aload against a silent server", timeout=30)


class _HangingCosmos:
    """Answers the account and container reads, then never answers an item request."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.item_requests: list[str] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                endpoint = f"http://127.0.0.1:{fake.port}/"
                if self.path == "/":
                    location = [{"name": "Local", "databaseAccountEndpoint": endpoint}]
                    self._reply(
                        {
                            "id": "fake",
                            "writableLocations": location,
                            "readableLocations": location,
                            "enableMultipleWriteLocations": False,
                            "userConsistencyPolicy": {"defaultConsistencyLevel": "Session"},
                            "queryEngineConfiguration": "{}",
                        }
                    )
                    return
                if self.path.rstrip("/") == "/dbs/db/colls/c":
                    self._reply(
                        {
                            "id": "c",
                            "_rid": "AAAAAA==",
                            "_self": "dbs/AAAA==/colls/AAAAAA==/",
                            "partitionKey": {"paths": ["/id"], "kind": "Hash", "version": 2},
                        }
                    )
                    return
                fake.item_requests.append(self.command)
                fake.release.wait(timeout=30)  # the hang: no answer until the test ends
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _HangingCosmos:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_server_that_stops_answering_mid_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """After opening, a silent save is StoreUnavailable (maybe applied), sent once."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    with _HangingCosmos() as fake:
        config = f"cosmos://127.0.0.1:{fake.port}/db/c?protocol=http&{_HUNG}"
        store = open_store(config)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="may or may not have been applied"):
            store.save(_cp("x"))
        assert time.monotonic() - started < 10, "sync save outlived its timeouts"
        assert fake.item_requests == ["POST"]

        async def body() -> None:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="may or may not have been applied"):
                await store.asave(_cp("y"))
            assert time.monotonic() - started < 10, "async save outlived its timeouts"
            with pytest.raises(StoreUnavailable):
                await store.aload("y")
            await store.aclose()

        _arun(body(), "asave against a server that stopped answering", timeout=30)
        assert fake.item_requests[:2] == ["POST", "POST"]


# -- against the emulator: async --------------------------------------------------------


def test_async_round_trip_conflicts_and_delete(config: str) -> None:
    """asave/aload/adelete keep the contract: ETag versions, 409/412, CAS delete."""

    async def body() -> None:
        async with open_store(config) as store:
            assert await store.aload("a/1") is None
            first = await store.asave(_cp("a/1", total_steps=3))
            second = await store.asave(
                _cp("a/1", step=1, version=first.version, created_at=first.created_at)
            )
            assert second.version != first.version
            assert await store.aload("a/1") == second
            with pytest.raises(ConflictError, match="409"):
                await store.asave(_cp("a/1"))
            with pytest.raises(ConflictError, match="412"):
                await store.asave(_cp("a/1", step=1, version=first.version))
            with pytest.raises(ConflictError, match="nothing was deleted"):
                await store.adelete("a/1", expected_version=first.version)
            assert await store.aload("a/1") == second
            assert [r async for r in store.alist_runs()] == ["a/1"]
            assert await store.adelete("a/1", expected_version=second.version)
            assert await store.adelete("a/1") is False
            assert await store.adelete("a/1", expected_version=second.version) is False
            with pytest.raises(ConflictError, match="deleted"):
                await store.asave(_cp("a/1", step=2, version=second.version))
            assert [r async for r in store.alist_runs()] == []

    _arun(body())


def test_async_exactly_one_request_per_save_and_load(config: str) -> None:
    """Through azure.cosmos.aio, each aload and asave sends exactly one HTTP request."""

    async def body() -> list[int]:
        async with open_store(config) as store:
            assert isinstance(store, CosmosStore)
            await store.aload("warm-up")  # opens: account read, create, container read
            counts = []
            before = store.requests_sent
            cp = await store.asave(_cp("one", total_steps=5))
            counts.append(store.requests_sent - before)
            for step in range(1, 4):
                before = store.requests_sent
                cp = await store.asave(_cp("one", step=step, version=cp.version, total_steps=5))
                counts.append(store.requests_sent - before)
                before = store.requests_sent
                assert await store.aload("one") == cp
                counts.append(store.requests_sent - before)
            deletes_before = store.requests_sent
            assert await store.adelete("one", expected_version=cp.version)
            deleted = store.requests_sent - deletes_before
            before = store.requests_sent
            assert await store.aload("one") is None
            counts.append(store.requests_sent - before)
            # The delete, then one query for the run's piece items (a long state's).
            counts.append(deleted - 1)
            return counts

    counts = _arun(body())
    assert counts == [1] * len(counts)


def test_sync_delete_with_expected_version(store: CosmosStore) -> None:
    """A stale expected_version deletes nothing (ConflictError, 1 request); a delete that
    deletes is 2 (a read of the item, then its delete; a run in pieces one query more)."""
    first = store.save(_cp("d/1"))
    second = store.save(_cp("d/1", step=1, version=first.version))
    before = store.requests_sent
    with pytest.raises(ConflictError, match="nothing was deleted") as info:
        store.delete("d/1", expected_version=first.version)
    assert info.value.run_id == "d/1" and store.requests_sent - before == 1
    assert store.load("d/1") == second
    before = store.requests_sent
    assert store.delete("d/1", expected_version=second.version)
    assert store.requests_sent - before == 2
    assert store.delete("d/1", expected_version=second.version) is False
    assert store.load("d/1") is None


def test_sync_and_async_share_the_item_layout(config: str) -> None:
    """A checkpoint with every schema-2 field saved by one path loads equal by the other."""
    with open_store(config) as sync_store:
        saved = sync_store.save(_runtime_cp("lay/1"))

        async def body() -> tuple[Any, Any]:
            async with open_store(config) as store:
                loaded = await store.aload("lay/1")
                again = await store.asave(_runtime_cp("lay/2"))
                return loaded, again

        loaded, again = _arun(body())
        assert loaded == saved and loaded.input["big"] == 2**63 + 1
        assert loaded.signals[0].payload == {"n": 2**60 + 3}
        assert sync_store.load("lay/2") == again


def test_async_save_fires_both_hooks_in_order(config: str) -> None:
    """asave fires cosmos.before_request then cosmos.request_sent; aload fires neither."""
    events: list[str] = []

    async def body() -> None:
        async with open_store(config) as store:
            await store.aload("warm-up")
            _hooks.install(events.append)
            try:
                await store.asave(_cp("hooked"))
                await store.aload("hooked")
            finally:
                _hooks.install(None)

    _arun(body())
    assert events == ["cosmos.before_request", "cosmos.request_sent"]


def test_one_store_serves_several_event_loops(store: CosmosStore) -> None:
    """Each event loop gets its own aio client; a second asyncio.run still works."""
    store.save(_cp("loops"))

    async def body() -> Any:
        return await store.aload("loops")

    first = _arun(body())
    second = _arun(body())
    assert first == second == store.load("loops")


def test_closed_store_refuses_async_calls(config: str) -> None:
    """After aclose, async and sync calls raise a closed-store StoreError."""

    async def body() -> None:
        store = open_store(config)
        await store.aload("x")
        await store.aclose()
        await store.aclose()  # twice is fine
        with pytest.raises(StoreError, match="closed"):
            await store.aload("x")
        with pytest.raises(StoreError, match="closed"):
            store.load("x")

    _arun(body())


class _HoldingProxy:
    """A TCP proxy to the emulator that can swallow the next write or its answer.

    ``arm("request")``: the next bytes from the client are never forwarded (the server
    never sees the write). ``arm("response")``: the write goes through, and the first
    bytes the server sends back on that connection after at least ``BIG`` bytes of it
    are held back (the write is applied, the client never hears). The threshold tells
    the write (made larger than ``BIG``) from TLS handshakes on a fresh connection.
    ``held`` is set when it happened; ``release()`` closes the held connection.
    """

    BIG = 16 * 1024

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)  # so the accept loop sees ``stop``
        self.stop = threading.Event()
        self.port = self.sock.getsockname()[1]
        self.mode: str | None = None
        self.forwarded: dict[int, int] = {}  # bytes sent upstream per connection, armed
        self.held = threading.Event()
        self.lock = threading.Lock()
        self.victims: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def arm(self, mode: str) -> None:
        with self.lock:
            self.mode = mode
            self.forwarded.clear()
            self.held.clear()

    def release(self) -> None:
        with self.lock:
            self.mode = None
            victims, self.victims = self.victims, []
        for conn in victims:
            with_suppress_close(conn)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                client, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            upstream = socket.create_connection(self.target, timeout=10)
            upstream.settimeout(None)
            for src, dst, kind in ((client, upstream, "request"), (upstream, client, "response")):
                thread = threading.Thread(
                    target=self._pump, args=(src, dst, kind, client, upstream), daemon=True
                )
                thread.start()

    def _swallow(self, kind: str, client: socket.socket, size: int) -> bool:
        """Decide, under the lock, whether this chunk is the one to hold back."""
        if self.mode == "request" and kind == "request":
            hit = True
        elif self.mode == "response" and kind == "response":
            hit = self.forwarded.get(id(client), 0) >= self.BIG
        else:
            if self.mode == "response":
                self.forwarded[id(client)] = self.forwarded.get(id(client), 0) + size
            return False
        if hit:
            self.mode = None
            self.held.set()
        return hit

    def _pump(
        self,
        src: socket.socket,
        dst: socket.socket,
        kind: str,
        client: socket.socket,
        upstream: socket.socket,
    ) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                with_suppress_close(client)
                with_suppress_close(upstream)
                return
            with self.lock:
                swallow = self._swallow(kind, client, len(data))
                if swallow:
                    self.victims.extend((client, upstream))
            if swallow:
                return  # never forwarded; release() closes both ends
            try:
                dst.sendall(data)
            except OSError:
                return

    def __enter__(self) -> _HoldingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()
        assert not self.thread.is_alive(), "the proxy's accept thread hung"


def with_suppress_close(conn: socket.socket) -> None:
    """Close ``conn``, ignoring a socket already gone."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
    conn.close()


class _NoDiscovery(CosmosStore):
    """A CosmosStore that talks only to the endpoint it is given (for the proxy test)."""

    def _client_kwargs(self) -> dict[str, Any]:
        return {**super()._client_kwargs(), "enable_endpoint_discovery": False}


@pytest.mark.parametrize(("mode", "lands"), [("request", False), ("response", True)])
def test_cancelled_asave_leaves_the_item_whole(
    mode: str, lands: bool, cosmos_env: Any, config: str
) -> None:
    """Cancelling an asave in flight leaves the old or the new item, and the client works."""
    with open_store(config) as direct:
        assert isinstance(direct, CosmosStore)
        old = direct.save(_cp("cancel/1", state={"v": "old"}))
        with _HoldingProxy(cosmos_env.host, cosmos_env.port) as proxy:
            # Straight to the proxy: endpoint discovery would follow the emulator's own
            # advertised address and go around it.
            proxied = _NoDiscovery(
                f"{cosmos_env.endpoint.split(':')[0]}://127.0.0.1:{proxy.port}/",
                direct.database_name,
                direct.container_name,
                credential=cosmos_env.key,
                verify=False,
                retries=0,
            )

            async def body() -> Any:
                async with proxied as store:
                    assert await store.aload("cancel/1") == old  # warm the connection
                    proxy.arm(mode)
                    # Larger than the proxy's threshold, so its answer is told apart; in
                    # the input, which the item holds (a state this long goes to pieces).
                    blob = "x" * (2 * _HoldingProxy.BIG)
                    new = _cp(
                        "cancel/1",
                        step=1,
                        state={"v": "new"},
                        input={"blob": blob},
                        version=old.version,
                    )
                    task = asyncio.create_task(store.asave(new))
                    held = await asyncio.to_thread(proxy.held.wait, 20)
                    assert held, f"the proxy never saw the asave's {mode}"
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                    proxy.release()
                    # The aio client is not left broken: the next calls work.
                    after = await store.aload("cancel/1")
                    assert after is not None
                    final = await store.asave(
                        _cp("cancel/1", step=2, state={"v": "after"}, version=after.version)
                    )
                    return after, final

            after, final = _arun(body(), f"asave cancelled with its {mode} held")
        blob = "x" * (2 * _HoldingProxy.BIG)
        assert after.state == ({"v": "new"} if lands else {"v": "old"})
        assert after.input == ({"blob": blob} if lands else None)
        assert after.step == (1 if lands else 0)
        assert direct.load("cancel/1") == final


# -- listings and claims -----------------------------------------------------------------


def _mixed_runs(store: CosmosStore) -> dict[str, Checkpoint]:
    """Save one run of every status (and a waiting run that is not yet due)."""
    from datetime import timedelta

    from stepstone import Failure

    now = _now()
    runs = {
        "run/a": _cp("run/a", total_steps=3, owner="w1", lease=30.0, renewed_at=now),
        "run/b": _cp(
            "run/b", total_steps=3, owner="w2", lease=30.0, renewed_at=now - timedelta(minutes=5)
        ),
        "queued/a": _cp("queued/a", step=-1, queued=True),
        "waiting/due": _cp(
            "waiting/due", total_steps=3, waiting_for="timer", wake_at=now - timedelta(hours=1)
        ),
        "waiting/later": _cp(
            "waiting/later", total_steps=3, waiting_for="timer", wake_at=now + timedelta(hours=1)
        ),
        "waiting/signal": _cp("waiting/signal", total_steps=3, waiting_for="signal go"),
        "done": _cp("done", step=0, total_steps=1),
        "failed": _cp(
            "failed", total_steps=3, failure=Failure(1, "s1", "ValueError", "bad", 1, now)
        ),
        "cancelled": _cp("cancelled", total_steps=3, cancelled=True),
    }
    return {run_id: store.save(cp) for run_id, cp in runs.items()}


def test_list_info_fills_version_owner_and_due_at(store: CosmosStore) -> None:
    """list_info reports what RunInfo.of the loaded checkpoint would, in one query."""
    from stepstone import RunInfo

    saved = _mixed_runs(store)
    before = store.requests_sent
    infos = {info.run_id: info for info in store.list_info()}
    assert store.requests_sent - before == 1
    assert set(infos) == set(saved)
    for run_id, cp in saved.items():
        want = RunInfo.of(cp)
        got = infos[run_id]
        assert (got.status, got.step, got.total_steps, got.version, got.owner, got.due_at) == (
            want.status,
            want.step,
            want.total_steps,
            want.version,
            want.owner,
            want.due_at,
        ), run_id
        assert got.updated_at == want.updated_at
    assert {i.status for i in infos.values()} == {
        "running",
        "queued",
        "waiting",
        "done",
        "failed",
        "cancelled",
    }


def test_claimable_returns_running_and_due_runs_from_three_queries(store: CosmosStore) -> None:
    """claimable: every running run, then due queued/waiting runs by due_at, capped."""
    from datetime import timedelta

    saved = _mixed_runs(store)
    now = _now() + timedelta(seconds=1)
    before = store.requests_sent
    found = store.claimable(now)
    assert store.requests_sent - before == 3
    ids = [info.run_id for info in found]
    # Running first, oldest lease end first; then due runs, earliest due first (a queued
    # run is due at once, DUE_NOW, whatever clock queued it).
    assert ids == ["run/b", "run/a", "queued/a", "waiting/due"]
    assert all(info.version == saved[info.run_id].version for info in found)
    capped = [info.run_id for info in store.claimable(now, limit=1)]
    assert capped == ["run/b", "queued/a"]
    # Two hours ago nothing was due but the queued run (due at once, always).
    earlier = [i.run_id for i in store.claimable(now - timedelta(hours=2))]
    assert earlier == ["run/b", "run/a", "queued/a"]
    with pytest.raises(ValueError, match="time zone"):
        store.claimable(now.replace(tzinfo=None))

    async def body() -> list[str]:
        async with open_store(f"{_store_config(store)}") as other:
            return [info.run_id for info in await other.aclaimable(now)]

    assert _arun(body()) == ids


def _store_config(store: CosmosStore) -> str:
    host = store.endpoint.split("//")[1].rstrip("/")
    protocol = "&protocol=http" if store.endpoint.startswith("http://") else ""
    return f"cosmos://{host}/{store.database_name}/{store.container_name}?verify=false{protocol}"


def test_claim_queries_read_listing_fields_only() -> None:
    """The claim and list queries select named fields, never the state, by status equality."""
    from stepstone.stores import cosmos

    for query in (cosmos._CLAIM_RUNNING, cosmos._CLAIM_DUE, cosmos._LIST_QUERY):
        assert "*" not in query and "c.state" not in query
    for query in (cosmos._CLAIM_RUNNING, cosmos._CLAIM_DUE):
        assert "c.status = @status" in query and "ORDER BY c.status ASC, c.due_at ASC" in query


def test_bad_items_are_skipped_in_listings(
    store: CosmosStore, cosmos_env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Hand-edited or foreign items are logged and skipped; the other runs still list."""
    good = store.save(_cp("good", total_steps=3, queued=True, step=-1))
    other = store.save(_cp("other", total_steps=3))
    raw = _raw_container(cosmos_env, store)
    item = raw.read_item("good", partition_key="good")
    body = {k: v for k, v in item.items() if not k.startswith("_")}
    raw.create_item({**body, "id": "bad-status", "run_id": "bad-status", "status": "exploded"})
    raw.create_item({**body, "id": "bad-time", "run_id": "bad-time", "updated_at": "yesterday"})
    raw.create_item({**body, "id": "bad-due", "run_id": "bad-due", "due_at": "0000-bad"})
    raw.create_item({**body, "id": "bad-step", "run_id": "bad-step", "step": "one"})
    raw.create_item({**body, "id": "copy-of-good"})  # run_id "good" under another id
    with caplog.at_level("WARNING", logger="stepstone"):
        infos = {info.run_id: info for info in store.list_info()}
        claims = store.claimable(_now())
        runs = sorted(store.list_runs())
    assert set(infos) == {"good", "other"}
    assert infos["good"].version == good.version and infos["other"].version == other.version
    assert [info.run_id for info in claims] == ["other", "good"]
    assert runs == ["good", "other"]
    logged = caplog.text
    for name in ("bad-status", "bad-time", "bad-due", "bad-step", "copy-of-good"):
        assert name in logged, name
    assert store.load("good") == good


def test_item_of_another_run_is_that_runs_corrupt_checkpoint(
    store: CosmosStore, cosmos_env: Any
) -> None:
    """A copy of run A's item stored under run B's id makes B's load CorruptCheckpoint."""
    kept = store.save(_cp("A"))
    raw = _raw_container(cosmos_env, store)
    body = {k: v for k, v in raw.read_item("A", partition_key="A").items() if k[0] != "_"}
    raw.create_item({**body, "id": item_id("B/b")})
    with pytest.raises(CorruptCheckpoint, match="holds run 'A'"):
        store.load("B/b")

    async def body_() -> None:
        async with open_store(_store_config(store)) as other:
            with pytest.raises(CorruptCheckpoint, match="holds run 'A'"):
                await other.aload("B/b")

    _arun(body_())
    assert store.load("A") == kept
    assert [info.run_id for info in store.list_info()] == ["A"]


# -- first contact: TLS and Entra ID against the emulator -----------------------------


def test_self_signed_certificate_gives_the_hint(
    cosmos_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify=true on the emulator's self-signed cert says REQUESTS_CA_BUNDLE / verify=false."""
    if not cosmos_env.endpoint.startswith("https://"):
        pytest.skip("the emulator serves plain HTTP")
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    config = (
        f"cosmos://{cosmos_env.host}:{cosmos_env.port}/stepstone-test/tls?retries=0"
        "&create=true&timeout=10"
    )
    with open_store(config) as store:
        with pytest.raises(StoreUnavailable) as info:
            store.load("x")
        assert "REQUESTS_CA_BUNDLE" in str(info.value) and "verify=false" in str(info.value)

        async def body() -> None:
            with pytest.raises(StoreUnavailable) as ainfo:
                await store.aload("x")
            assert "REQUESTS_CA_BUNDLE" in str(ainfo.value)
            assert "verify=false" in str(ainfo.value)
            await store.aclose()

        _arun(body(), "aload against an untrusted certificate")


def test_ca_bundle_makes_the_emulator_trusted(
    cosmos_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With REQUESTS_CA_BUNDLE naming the emulator's cert, verify=true works, sync and async."""
    if not isinstance(cosmos_env.connection_verify, str):
        pytest.skip("needs the emulator's certificate file (container or process mode)")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", cosmos_env.connection_verify)
    config = (
        f"cosmos://{cosmos_env.host}:{cosmos_env.port}/stepstone-test/"
        f"ca-{uuid.uuid4().hex[:8]}?create=true"
    )
    with open_store(config) as store:
        saved = store.save(_cp("tls"))

        async def body() -> Any:
            async with open_store(config) as other:
                return await other.aload("tls")

        assert _arun(body()) == saved


def test_entra_without_an_identity_is_a_short_permission_error(
    cosmos_env: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No key and no Entra identity: StorePermissionError under 300 characters."""
    for name in list(os.environ):
        if name.startswith(("AZURE_", "IDENTITY_", "MSI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")  # no `az`, `azd` or `pwsh` to ask
    config = f"cosmos://{cosmos_env.host}:{cosmos_env.port}/stepstone-test/entra?verify=false"
    with open_store(config) as store:
        assert isinstance(store, CosmosStore) and store.auth == "entra"
        with pytest.raises(StorePermissionError) as info:
            store.load("x")
    message = str(info.value)
    assert len(message) < 300, message
    assert "AZURE_COSMOS_KEY" in message and "az login" in message


class _GateTransport:
    """An aiohttp transport whose next write waits for ``release``: a held driver."""

    def __init__(self) -> None:
        from azure.core.pipeline.transport import AioHttpTransport

        self.inner = AioHttpTransport(connection_verify=False)
        self.armed = False
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def send(self, request: Any, **kwargs: Any) -> Any:
        if self.armed and request.method in ("POST", "PUT"):
            self.armed = False
            self.entered.set()
            await self.release.wait()
        return await self.inner.send(request, **kwargs)

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def __aenter__(self) -> _GateTransport:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *args: Any) -> None:
        await self.inner.__aexit__(*args)


def test_loop_runs_other_tasks_while_a_save_is_held_in_the_driver(cosmos_env: Any) -> None:
    """While asave waits inside the transport, other tasks on the loop keep running."""

    async def body() -> int:
        gate = _GateTransport()
        store = CosmosStore(
            cosmos_env.endpoint,
            "stepstone-test",
            f"gate-{uuid.uuid4().hex[:8]}",
            credential=cosmos_env.key,
            verify=False,
            create=True,
            async_transport=cast(Any, gate),
        )
        async with store:
            await store.aload("warm-up")
            gate.armed = True
            saving = asyncio.create_task(store.asave(_cp("held")))
            async with asyncio.timeout(20):
                await gate.entered.wait()  # the save is now inside the driver
            ticks = 0
            while ticks < 5:  # progress of another task: the loop is free
                await asyncio.sleep(0)
                ticks += 1
            assert not saving.done(), "the held save finished before it was released"
            gate.release.set()
            async with asyncio.timeout(20):
                saved = await saving
            assert await store.aload("held") == saved
            return ticks

    assert _arun(body(), "a save held in the driver") == 5


def test_init_adds_the_claim_index_to_an_older_container(cosmos_env: Any) -> None:
    """A container with the pre-schema-2 policy gets the claim index from init()."""
    import copy

    from azure.cosmos import PartitionKey

    policy = copy.deepcopy(CONTAINER_DEFINITION["indexingPolicy"])
    del policy["compositeIndexes"]
    policy["includedPaths"] = [
        p
        for p in policy["includedPaths"]
        if p["path"] not in ("/status/?", "/due_at/?", "/owner/?", "/piece_of/?", "/gen/?")
    ]
    name = f"old-{uuid.uuid4().hex[:8]}"
    client = CosmosClient(cosmos_env.endpoint, cosmos_env.key, **cosmos_env.client_kwargs())
    database = client.create_database_if_not_exists("stepstone-test")
    database.create_container(
        name, partition_key=PartitionKey(path="/id"), indexing_policy=policy, default_ttl=-1
    )
    with open_store(_config(cosmos_env, "stepstone-test", name, "create=false")) as store:
        checks = {c.check: c for c in store.doctor()}
        assert not checks["claim index (status, due_at)"].ok
        assert "container.json" in checks["claim index (status, due_at)"].detail
        assert not checks["piece paths indexed (/piece_of, /gen)"].ok
        lines = store.init()
        assert any("claim index" in line and "added" in line for line in lines), lines
        assert {c.check: c for c in store.doctor()}["claim index (status, due_at)"].ok
        assert {c.check: c for c in store.doctor()}["piece paths indexed (/piece_of, /gen)"].ok
        assert not any("added" in line for line in store.init())  # once is enough
    properties = database.get_container_client(name).read()
    assert properties["defaultTtl"] == -1


def test_entra_failure_keeps_the_credential_chain_off_stderr(
    cosmos_env: Any, tmp_path: Path
) -> None:
    """In a fresh process with no logging set up, stderr shows no credential-chain report."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "IDENTITY_", "MSI_"))}
    env.update(HOME=str(tmp_path), PATH="/nonexistent")
    config = f"cosmos://{cosmos_env.host}:{cosmos_env.port}/stepstone-test/entra?verify=false"
    script = (
        "import sys\nfrom stepstone import open_store\n"
        f"store = open_store({config!r})\n"
        "try:\n    store.load('x')\nexcept Exception as exc:\n"
        "    print(type(exc).__name__, len(str(exc)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    name, length = done.stdout.split()
    assert name == "StorePermissionError" and int(length) < 300
    assert "Attempted credentials" not in done.stderr, done.stderr[:500]


def _saver_loop_cp(run_id: str, previous: Checkpoint | None, n: int) -> Checkpoint:
    if previous is None:
        return _cp(run_id, state={"n": n})
    return _cp(run_id, state={"n": n}, version=previous.version)


def test_aclose_during_saves_gives_the_closed_error(config: str) -> None:
    """aclose() under 20 saving tasks: each ends with the closed-store error, items whole."""

    async def body() -> list[BaseException]:
        store = open_store(config)
        await store.aload("warm-up")
        started = asyncio.Event()

        async def saver(i: int) -> None:
            saved: Checkpoint | None = None
            for n in range(10_000):
                saved = await store.asave(_saver_loop_cp(f"close/{i}", saved, n))
                started.set()

        tasks = [asyncio.create_task(saver(i)) for i in range(20)]
        await asyncio.wait_for(started.wait(), 20)
        await asyncio.sleep(0.2)  # let saves be in flight when the store closes
        await store.aclose()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        return [r for r in results if isinstance(r, BaseException)]

    errors = _arun(body(), "saving tasks after aclose")
    assert len(errors) == 20
    assert all(type(e) is StoreError and "is closed" in str(e) for e in errors), errors
    with open_store(config) as fresh:
        for i in range(20):
            loaded = fresh.load(f"close/{i}")
            assert loaded is None or set(loaded.state) == {"n"}


def test_close_during_threaded_saves_gives_the_closed_error(config: str) -> None:
    """close() under 8 saving threads: each ends with the closed-store error, no crash."""
    store = open_store(config)
    store.load("warm-up")
    errors: list[BaseException] = []
    started = threading.Barrier(9, timeout=20)

    def saver(i: int) -> None:
        saved: Checkpoint | None = None
        try:
            started.wait()
            for n in range(10_000):
                saved = store.save(_saver_loop_cp(f"tclose/{i}", saved, n))
        except BaseException as exc:  # noqa: BLE001 - the test collects whatever close() causes
            errors.append(exc)

    threads = [threading.Thread(target=saver, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    started.wait()
    time.sleep(0.2)  # let saves be in flight when the store closes
    store.close()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), f"{thread.name} kept saving after close()"
    assert len(errors) == 8
    assert all(type(e) is StoreError and "is closed" in str(e) for e in errors), errors


def test_key_never_reaches_the_logs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With every logger at DEBUG, a refused key appears in no log record or error."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    with caplog.at_level("DEBUG"), _FakeCosmos("401") as fake:
        store = open_store(fake.config())
        with pytest.raises(StorePermissionError) as info:
            store.load("x")

        async def body() -> None:
            with pytest.raises(StorePermissionError) as ainfo:
                await store.aload("x")
            assert FAKE_KEY not in str(ainfo.value)
            await store.aclose()

        _arun(body(), "aload against a server refusing the key")
    assert caplog.records, "nothing was logged at DEBUG: the check would be vacuous"
    assert FAKE_KEY not in caplog.text and FAKE_KEY not in str(info.value)
    assert FAKE_KEY not in repr(store)


# -- nothing a Cosmos call raises escapes as a bare exception --------------------------------


def _store_calls(store: CosmosStore) -> dict[str, Any]:
    """Each Store method that talks to the service, sync and async, as a thunk.

    The async ones run on one event loop, closed at the end (``_outcomes``).
    """
    now = _now()
    return {
        "load": lambda: store.load("x"),
        "save": lambda: store.save(_cp("x")),
        "replace": lambda: store.save(_cp("x", version='"v1"')),
        "delete": lambda: store.delete("x"),
        "claimable": lambda: store.claimable(now),
        "claimable-status": lambda: store.claimable(now, status="queued"),
        "list_info": lambda: list(store.list_info()),
        "aload": lambda: store.aload("x"),
        "asave": lambda: store.asave(_cp("x")),
        "adelete": lambda: store.adelete("x"),
        "aclaimable": lambda: store.aclaimable(now),
        "alist_info": lambda: _collect(store.alist_info()),
    }


async def _collect(rows: Any) -> list[Any]:
    return [row async for row in rows]


def _outcomes(store: CosmosStore) -> dict[str, Any]:
    """Run every ``_store_calls`` call: its result, or the exception it raised."""
    calls = _store_calls(store)
    found: dict[str, Any] = {}
    for name, call in calls.items():
        if not name.startswith("a"):
            try:
                found[name] = call()
            except Exception as exc:  # noqa: BLE001 - the outcome under test, checked after
                found[name] = exc

    async def body() -> None:
        for name, call in calls.items():
            if name.startswith("a"):
                try:
                    found[name] = await call()
                except Exception as exc:  # noqa: BLE001 - the outcome under test, checked after
                    found[name] = exc
        await store.aclose()

    _arun(body(), "the async store calls")
    return found


@pytest.mark.parametrize("behaviour", sorted(_GARBLED))
def test_garbled_answers_are_store_errors(behaviour: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 200 whose body is cut short, not UTF-8, not JSON or not an item is a StoreError."""
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    with _FakeCosmos(behaviour) as fake, open_store(fake.config(retries=0)) as store:
        assert isinstance(store, CosmosStore)
        for name, outcome in _outcomes(store).items():
            if isinstance(outcome, BaseException):
                # An answer that does not decode is the network's fault, retried later; one
                # that decodes to no item makes the SDK itself raise TypeError: a StoreError.
                expected = StoreError if behaviour in ("array", "scalar") else StoreUnavailable
                assert isinstance(outcome, expected), (name, repr(outcome))
                assert FAKE_KEY not in str(outcome)
            else:
                # Only a query or a delete may come back: rows that are not items are
                # skipped, and a delete reads no answer.
                assert name in _NO_BODY_NEEDED, (name, outcome)
        assert fake.item_requests, "the fake server saw no item request: vacuous"


_NO_BODY_NEEDED = frozenset(
    {"claimable", "claimable-status", "list_info", "aclaimable", "alist_info", "delete", "adelete"}
)


def test_item_answer_that_is_not_an_item_is_a_store_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A point read or save answered with a JSON array raises StoreError, not TypeError.

    (The SDK itself raises TypeError building its answer from an array.)
    """
    monkeypatch.setenv("AZURE_COSMOS_KEY", FAKE_KEY)
    with _FakeCosmos("array") as fake, open_store(fake.config(retries=0)) as store:
        calls: list[Callable[[], object]] = [lambda: store.load("x"), lambda: store.save(_cp("x"))]
        for call in calls:
            with pytest.raises(StoreError) as info:
                call()
            assert "TypeError" in str(info.value) or "_etag" in str(info.value)


def test_decoding_refuses_an_answer_that_is_not_an_item() -> None:
    """An item that is not a JSON object is a CorruptCheckpoint, whatever the SDK passed."""
    store = CosmosStore("https://example.invalid/", "db", "c", credential=FAKE_KEY)
    for answer in ([1, 2], "text", 42, None):
        with pytest.raises(CorruptCheckpoint, match="not an item"):
            store._checkpoint(answer, "x")


def _aiohttp_errors() -> list[BaseException]:
    aiohttp = pytest.importorskip("aiohttp")
    return [
        aiohttp.ClientPayloadError("Response payload is not completed"),
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientOSError(104, "Connection reset by peer"),
    ]


def _transport_errors() -> list[BaseException]:
    """What a transport below azure-core can raise when a server dies mid-answer."""
    import http.client
    import ssl

    import requests
    import urllib3

    return [
        ConnectionResetError(104, "Connection reset by peer"),
        BrokenPipeError(32, "Broken pipe"),
        http.client.RemoteDisconnected("Remote end closed connection without response"),
        http.client.IncompleteRead(b"{", 1000),
        json.JSONDecodeError("Expecting value", "<html>", 0),
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
        ssl.SSLError("record layer failure"),
        requests.exceptions.ChunkedEncodingError("Connection broken: IncompleteRead"),
        urllib3.exceptions.ProtocolError("Connection aborted."),
        *_aiohttp_errors(),
    ]


class _Raising:
    """A container (sync or aio) whose every call raises ``exc``."""

    def __init__(self, exc: BaseException, asynchronous: bool) -> None:
        self.exc = exc
        self.asynchronous = asynchronous

    def __getattr__(self, name: str) -> Any:
        if self.asynchronous and name != "query_items":

            async def acall(*args: Any, **kwargs: Any) -> Any:
                raise self.exc

            return acall

        def call(*args: Any, **kwargs: Any) -> Any:
            raise self.exc

        return call


def _with_container(store: CosmosStore, exc: BaseException) -> None:
    """Make ``store`` open on a container that raises ``exc`` (sync and on this loop)."""
    from stepstone.stores.cosmos._aio import AioClient

    store._container = cast(Any, _Raising(exc, asynchronous=False))

    async def aio_open() -> Any:
        loop = asyncio.get_running_loop()
        aio = AioClient(loop, cast(Any, None), cast(Any, _Raising(exc, True)), None)
        store._aios[loop] = aio
        return aio.container

    store._aensure_open = aio_open  # type: ignore[method-assign]


@pytest.mark.parametrize("exc", _transport_errors(), ids=lambda e: type(e).__name__)
def test_transport_failures_are_unavailable(exc: BaseException) -> None:
    """Each failure of the transport, from any store call, is StoreUnavailable from it."""
    store = CosmosStore("https://acct.example/", "db", "c", credential=FAKE_KEY)
    _with_container(store, exc)
    for name, outcome in _outcomes(store).items():
        assert isinstance(outcome, StoreUnavailable), (name, repr(outcome))
        assert outcome.__cause__ is exc, name
        assert type(exc).__name__ in str(outcome), (name, str(outcome))


@pytest.mark.parametrize(
    "exc", [RuntimeError("sdk bug"), AttributeError("'NoneType' has no attribute 'get'")]
)
def test_unexpected_sdk_exceptions_are_store_errors(exc: BaseException) -> None:
    """An exception no table row names, raised by an SDK call, is a StoreError naming it."""
    store = CosmosStore("https://acct.example/", "db", "c", credential=FAKE_KEY)
    _with_container(store, exc)
    for name, outcome in _outcomes(store).items():
        assert type(outcome) is StoreError, (name, repr(outcome))
        assert type(exc).__name__ in str(outcome), name
        assert outcome.__cause__ is not None and outcome.__cause__.__cause__ is exc


def test_every_exception_rule_is_tested() -> None:
    """Every exception type the table names is raised by one of the tests above."""
    # TimeoutError (its own message: "timed out") is mapped in
    # test_exception_rules_map_transport_failures; the rest by the transport tests.
    tested = {type(exc) for exc in _transport_errors()} | {TimeoutError}
    named = {
        kind
        for rule in _EXCEPTION_RULES
        for kind in rule.types
        if not kind.__module__.startswith("azure.") and kind is not _Unexpected
    }
    assert named, "the table names no transport exception: vacuous"
    assert all(any(issubclass(t, kind) for t in tested) for kind in named), named
    classes = {name for rule in _EXCEPTION_RULES for name in rule.classes}
    assert all(any(name in {c.__name__ for c in t.__mro__} for t in tested) for name in classes)


def test_garbled_container_properties_are_a_store_error() -> None:
    """Container properties that are not an object refuse the store, not crash it."""

    class Fake:
        def __init__(self, answer: Any) -> None:
            self.answer = answer

        def get_database_client(self, name: str) -> Fake:
            return self

        def get_container_client(self, name: str) -> Fake:
            return self

        def read(self, **kwargs: Any) -> Any:
            return self.answer

    for answer in (["not", "an", "object"], {"partitionKey": "/id"}, None, "text"):
        store = CosmosStore("https://acct.example/", "db", "c", credential=FAKE_KEY)
        store._client = cast(Any, Fake(answer))
        with pytest.raises(StoreError, match="is partitioned by None"):
            store.load("x")
