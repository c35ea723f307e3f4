"""CosmosStore against a real Cosmos DB emulator, plus a fake server for what it cannot do.

The emulator comes from ``tests/cosmos_emulator.py`` (Docker image, node process, or
``STEPSTONE_COSMOS_ENDPOINT``). Without one the emulator tests are skipped loudly, and
fail when ``CI`` is set. Failures the emulator cannot produce (401, 429, a dropped
connection) come from ``_FakeCosmos``, a tiny HTTP server speaking just enough of the
Cosmos REST API, so the real SDK and transport still run end to end.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.cosmos")

from azure.cosmos import CosmosClient

from stepstone import (
    Checkpoint,
    CheckpointTooLarge,
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    StoreError,
    StorePermissionError,
    StoreUnavailable,
    _hooks,
    open_store,
)
from stepstone.stores.cosmos import (
    CONTAINER_DEFINITION,
    MAX_ITEM_BYTES,
    CosmosStore,
    item_id,
)

REPO = Path(__file__).resolve().parent.parent
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
    assert on_disk["defaultTtl"] == -1


def test_bicep_uses_the_same_indexing_policy() -> None:
    """main.bicep declares the partition key, the state exclusion, TTL and the data role."""
    bicep = (REPO / "backends" / "cosmos" / "main.bicep").read_text()
    for needle in ("'/id'", "'/state/*'", "defaultTtl: -1", "00000000-0000-0000-0000-000000000002"):
        assert needle in bicep, needle
    for path in CONTAINER_DEFINITION["indexingPolicy"]["includedPaths"]:
        assert f"'{path['path']}'" in bicep, path


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
        ("cosmos://h/db/c?colour=blue", "known options: auth, consistency, create"),
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
    """Over 2 MB: CheckpointTooLarge with size and limit, no request, stored item unchanged."""
    kept = store.save(_cp("big"))
    events: list[str] = []
    _hooks.install(events.append)
    try:
        before = store.requests_sent
        with pytest.raises(CheckpointTooLarge) as info:
            store.save(
                _cp("big", step=1, state={"blob": "x" * MAX_ITEM_BYTES}, version=kept.version)
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
    store.save(_cp("big", step=1, state={"blob": "y" * fits}, version=kept.version))


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
    assert checks["checkpoint schema 1"].ok
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
