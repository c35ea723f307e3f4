"""A user's SQLAlchemy Engine under the SQL stores: their pool, their connection hooks.

``SQLiteStore.from_engine``, ``PostgresStore.from_engine`` and ``MySQLStore.from_engine``
take every connection from the engine's pool; a ``do_connect`` event that counts its
calls (where a real one would set an Entra ID token as the password) proves the user's
hook opened them.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sqlalchemy = pytest.importorskip("sqlalchemy")

from stepstone import Checkpoint, ConfigError, ConflictError, run  # noqa: E402
from stepstone.stores.mysql import MySQLStore  # noqa: E402
from stepstone.stores.postgres import PostgresStore  # noqa: E402
from stepstone.stores.sqlite import SQLiteStore  # noqa: E402
from stepstone.testing import StoreContract, backend_unavailable  # noqa: E402

PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MY = "mysql+pymysql://root@127.0.0.1:3306/test"
# The contract's load test drives 500 runs at once in one loop, and on the backends
# themselves (test_contract.py) it still does. Here the question is the connection path
# (a user's engine: its pool, or the NullPool below), which 50 at once already crowd
# (over three times a default pool's 15 connections), in a tenth of the time (PostgreSQL's
# took 54 s of the rest tier, and its 500 NullPool connections timed out on a busy machine).
CONNECTION_PATH_RUNS = 50


class Hook:
    """A ``do_connect`` listener: counts the connections it opened, sets a "token"."""

    def __init__(self, engine: Any, password: str | None = None) -> None:
        self.calls = 0
        self.password = password
        sqlalchemy.event.listen(engine, "do_connect", self)

    def __call__(self, dialect: Any, conn_rec: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        self.calls += 1
        if self.password is not None:  # what an Entra ID token hook does
            cparams["password"] = self.password


def _engine(kind: str, tmp_path: Path) -> Any:
    if kind == "sqlite":
        return sqlalchemy.create_engine(f"sqlite+pysqlite:///{tmp_path / 'runs.db'}")
    if kind == "postgresql":
        engine = sqlalchemy.create_engine(PG, connect_args={"connect_timeout": 3})
    else:
        # SQLAlchemy asks for CLIENT.FOUND_ROWS unless told otherwise (see MySQLStore).
        engine = sqlalchemy.create_engine(MY, connect_args={"client_flag": 0, "connect_timeout": 3})
    try:
        engine.connect().close()
    except Exception as exc:  # noqa: BLE001 - a server that fails in any way is unavailable: skip
        engine.dispose()
        backend_unavailable(f"{kind}: {type(exc).__name__}: {exc}")
    engine.dispose()  # the probe's connection: the store's must be new ones
    return engine


def _open(kind: str, engine: Any, table: str) -> Any:
    if kind == "sqlite":
        return SQLiteStore.from_engine(engine)
    if kind == "postgresql":
        return PostgresStore.from_engine(engine, table=table)
    return MySQLStore.from_engine(engine, table=table)


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def engine(kind: str, tmp_path: Path) -> Iterator[Any]:
    engine = _engine(kind, tmp_path)
    yield engine
    engine.dispose()


@pytest.fixture
def table(kind: str, engine: Any) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex}"
    yield name
    if kind != "sqlite":
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}, {name}_meta, {name}_pieces")


@pytest.fixture
def hook(engine: Any) -> Hook:
    return Hook(engine)


@pytest.fixture
def store(kind: str, engine: Any, table: str, hook: Hook) -> Iterator[Any]:
    with _open(kind, engine, table) as s:
        yield s


def test_the_users_connect_hook_opens_the_stores_connections(store: Any, hook: Hook) -> None:
    """Every connection the store uses comes from the engine: its do_connect hook ran."""
    assert hook.calls >= 1
    saved = store.save(Checkpoint("r", state={"n": 1}))
    loaded = store.load("r")
    assert loaded is not None and loaded.state == {"n": 1} and loaded.version == saved.version
    assert hook.calls >= 1


def test_the_store_keeps_its_guarantees_on_an_engine(store: Any) -> None:
    """Compare-and-swap, delete, listing and claimable hold on engine connections."""
    first = store.save(Checkpoint("r", state={"n": 1}))
    with pytest.raises(ConflictError):
        store.save(Checkpoint("r", state={"n": 2}))  # a second first save loses
    second = store.save(Checkpoint("r", state={"n": 2}, version=first.version))
    with pytest.raises(ConflictError):
        store.save(Checkpoint("r", state={"n": 3}, version=first.version))  # stale
    assert list(store.list_runs()) == ["r"]
    assert [info.version for info in store.list_info()] == [second.version]
    with pytest.raises(ConflictError):
        store.delete("r", expected_version=first.version)
    assert store.delete("r", expected_version=second.version) is True
    assert store.load("r") is None


def test_a_workflow_runs_on_an_engine_backed_store(store: Any) -> None:
    """The runner drives an engine-backed store like any other."""
    from stepstone import Step, Workflow

    wf = Workflow("w", [Step("a", lambda s: {**s, "a": 1}), Step("b", lambda s: {**s, "b": 2})])
    assert run("r1", wf, store, input={}) == {"a": 1, "b": 2}


def test_async_methods_work_on_an_engine_backed_store(store: Any) -> None:
    """The async methods run on the engine's pool too (on threads), same contract."""

    async def main() -> None:
        saved = await store.asave(Checkpoint("a", state={"n": 1}))
        loaded = await store.aload("a")
        assert loaded is not None and loaded.version == saved.version
        with pytest.raises(ConflictError):
            await store.asave(Checkpoint("a", state={"n": 2}))
        assert [run_id async for run_id in store.alist_runs()] == ["a"]
        assert await store.adelete("a") is True

    asyncio.run(main())


def test_each_call_gives_its_connection_back_as_it_was(kind: str, engine: Any, table: str) -> None:
    """Each call gives its connection back to the engine's pool, autocommit undone."""
    with _open(kind, engine, table) as s:
        s.save(Checkpoint("r"))
        assert engine.pool.checkedout() == 0
        assert s.load("r") is not None
        assert engine.pool.checkedout() == 0
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        if kind == "sqlite":
            assert raw.isolation_level is not None
        elif kind == "postgresql":
            assert raw.autocommit is False
        else:
            assert raw.get_autocommit() is False


def test_a_token_hook_sets_the_password_of_each_connection(tmp_path: Path) -> None:
    """A do_connect hook that sets the password (an Entra ID token) is what connects."""
    engine = _engine("postgresql", tmp_path)
    table = f"t_{uuid.uuid4().hex}"
    hook = Hook(engine, password="token-1")
    try:
        with PostgresStore.from_engine(engine, table=table) as s:
            s.save(Checkpoint("r"))
            assert "token-1" not in repr(s) and "token-1" not in s.where
        assert hook.calls >= 1
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}, {table}_meta, {table}_pieces")
        engine.dispose()


def test_a_mysql_engine_with_found_rows_is_refused(tmp_path: Path) -> None:
    """SQLAlchemy's default CLIENT.FOUND_ROWS would hide lost swaps: the store refuses it."""
    engine = _engine("mysql", tmp_path)
    default = sqlalchemy.create_engine(MY)
    try:
        with pytest.raises(ConfigError, match="client_flag"):
            MySQLStore.from_engine(default, table=f"t_{uuid.uuid4().hex}")
    finally:
        default.dispose()
        engine.dispose()


def test_an_engine_of_another_database_or_driver_is_refused(tmp_path: Path) -> None:
    """A SQLite engine is not a PostgreSQL store, and an AsyncEngine is not a sync one."""
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = sqlalchemy.create_engine(f"sqlite+pysqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(ConfigError, match="postgresql"):
        PostgresStore.from_engine(engine)
    with pytest.raises(ConfigError, match="needs a SQLAlchemy Engine"):
        SQLiteStore.from_engine(object())
    aengine = create_async_engine("postgresql+psycopg://postgres@127.0.0.1/test")
    with pytest.raises(ConfigError, match="AsyncEngine"):
        PostgresStore.from_engine(aengine)
    with pytest.raises(ConfigError, match="async_engine needs an AsyncEngine"):
        PostgresStore.from_engine(sqlalchemy.create_engine(PG), async_engine=engine)


# --- AsyncEngine: the async methods on the user's native async connections -------------

ASYNC_URLS = {
    "postgresql": ("postgresql+psycopg://postgres@127.0.0.1:5432/test", {"connect_timeout": 3}),
    "mysql": ("mysql+aiomysql://root@127.0.0.1:3306/test", {"client_flag": 0}),
}


@pytest.fixture(params=["postgresql", "mysql"])
def server(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _checked_out(aengine: Any) -> int:
    pool: Any = aengine.sync_engine.pool
    return int(pool.checkedout())


def _store_class(kind: str) -> Any:
    return PostgresStore if kind == "postgresql" else MySQLStore


def test_an_async_engine_serves_the_async_methods(server: str, tmp_path: Path) -> None:
    """With async_engine=, the async methods use its pool: its do_connect hook ran."""
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = _engine(server, tmp_path)
    table = f"t_{uuid.uuid4().hex}"
    url, args = ASYNC_URLS[server]

    async def main() -> None:
        aengine = create_async_engine(url, connect_args=args)
        hook = Hook(aengine.sync_engine)
        try:
            store = _store_class(server).from_engine(engine, async_engine=aengine, table=table)
            async with store:
                assert hook.calls == 0  # opening used the sync engine
                first = await store.asave(Checkpoint("a", state={"n": 1}))
                assert hook.calls >= 1
                with pytest.raises(ConflictError):
                    await store.asave(Checkpoint("a", state={"n": 2}))
                loaded = await store.aload("a")
                assert loaded is not None and loaded.version == first.version
                assert [r async for r in store.alist_runs()] == ["a"]
                assert [i.run_id for i in await store.aclaimable(first.updated_at)] == ["a"]
                assert await store.adelete("a", expected_version=first.version) is True
                assert _checked_out(aengine) == 0  # given back after each call
            assert _checked_out(aengine) == 0
        finally:
            await aengine.dispose()

    try:
        asyncio.run(main())
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}, {table}_meta, {table}_pieces")
        engine.dispose()


def test_a_cancelled_async_call_leaves_no_connection_in_use(server: str, tmp_path: Path) -> None:
    """A cancelled call's connection is invalidated in the user's pool, never reused."""
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = _engine(server, tmp_path)
    table = f"t_{uuid.uuid4().hex}"
    url, args = ASYNC_URLS[server]

    async def main() -> None:
        aengine = create_async_engine(url, connect_args=args)
        try:
            store = _store_class(server).from_engine(engine, async_engine=aengine, table=table)
            async with store:
                await store.asave(Checkpoint("r"))
                sleep = "SELECT pg_sleep(5)" if server == "postgresql" else "SELECT SLEEP(5)"
                task = asyncio.ensure_future(store._aexec(sleep))
                await asyncio.sleep(0.5)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                for _ in range(50):  # the invalidation runs on a task of this loop
                    if _checked_out(aengine) == 0:
                        break
                    await asyncio.sleep(0.1)
                assert _checked_out(aengine) == 0
                assert (await store.aload("r")) is not None
            assert _checked_out(aengine) == 0
        finally:
            await aengine.dispose()

    try:
        asyncio.run(main())
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}, {table}_meta, {table}_pieces")
        engine.dispose()


# --- the contract suite on engine-backed stores ----------------------------------------
#
# The suite opens stores from config strings, in this process and in child processes,
# so each engine-backed store is a backend of its own scheme: ``sqlaengine-<kind>://``.
# Its ``from_config`` builds the engines from the URL and opens the store on them; a
# child process finds the scheme through the ``stepstone.stores`` entry point of a
# distribution written to a temporary directory on its ``PYTHONPATH``.

SCHEMES = {
    "sqlaengine-sqlite": "EngineSQLiteStore",
    "sqlaengine-postgresql": "EnginePostgresStore",
    "sqlaengine-mysql": "EngineMySQLStore",
}


class _OwnsEngines:
    """Disposes the engines it was opened on when closed (they are the test's own)."""

    engines: tuple[Any, ...] = ()

    def close(self) -> None:
        super().close()  # type: ignore[misc]
        for engine in self.engines:
            (getattr(engine, "sync_engine", None) or engine).dispose()


class EngineSQLiteStore(_OwnsEngines, SQLiteStore):
    """``sqlaengine-sqlite:///path.db``: a SQLiteStore on an Engine of that file."""

    @classmethod
    def from_config(cls, config: str) -> EngineSQLiteStore:
        engine = sqlalchemy.create_engine("sqlite+pysqlite:" + config.partition(":")[2])
        store = cls.from_engine(engine)
        store.engines = (engine,)
        return store


def _server_engines(kind: str, config: str) -> tuple[Any, Any, str]:
    from urllib.parse import parse_qs, urlsplit

    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    parts = urlsplit(config)
    table = parse_qs(parts.query)["table"][0]
    if kind == "postgresql":
        sync_url, async_url, args = PG, PG, {"connect_timeout": 3}
    else:
        sync_url, async_url, args = MY, ASYNC_URLS["mysql"][0], {"client_flag": 0}
    engine = sqlalchemy.create_engine(sync_url, connect_args=args)
    # NullPool: a connection given back is closed at once, on the loop that used it.
    aengine = create_async_engine(async_url, connect_args=args, poolclass=NullPool)
    return engine, aengine, table


class EnginePostgresStore(_OwnsEngines, PostgresStore):
    """``sqlaengine-postgresql://?table=T``: a PostgresStore on an Engine and AsyncEngine."""

    @classmethod
    def from_config(cls, config: str) -> EnginePostgresStore:
        engine, aengine, table = _server_engines("postgresql", config)
        store = cls.from_engine(engine, async_engine=aengine, table=table)
        store.engines = (engine, aengine)
        return store


class EngineMySQLStore(_OwnsEngines, MySQLStore):
    """``sqlaengine-mysql://?table=T``: a MySQLStore on an Engine and AsyncEngine."""

    @classmethod
    def from_config(cls, config: str) -> EngineMySQLStore:
        engine, aengine, table = _server_engines("mysql", config)
        store = cls.from_engine(engine, async_engine=aengine, table=table)
        store.engines = (engine, aengine)
        return store


@pytest.fixture(scope="module")
def engine_schemes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Register the schemes here, and for child processes through an entry point."""
    from stepstone import register_store

    for scheme, name in SCHEMES.items():
        register_store(scheme, globals()[name])
    site = tmp_path_factory.mktemp("site")
    info = site / "stepstone_sqlaengine_test-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: stepstone-sqlaengine-test\n")
    points = "".join(f"{s} = test_sqlalchemy_engine:{n}\n" for s, n in SCHEMES.items())
    (info / "entry_points.txt").write_text("[stepstone.stores]\n" + points)
    here = str(Path(__file__).resolve().parent)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), here, *([old] if old else [])])
    # multiprocessing's spawned children take the parent's sys.path, not PYTHONPATH.
    added = [p for p in (str(site), here) if p not in sys.path]
    sys.path[:0] = added
    yield
    for path in added:
        sys.path.remove(path)
    if old is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = old


def _fresh_server_table(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> str:
    engine = _engine(kind, tmp_path)
    table = f"t_{uuid.uuid4().hex}"

    def drop() -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}, {table}_meta, {table}_pieces")
        engine.dispose()

    request.addfinalizer(drop)
    return f"sqlaengine-{kind}://127.0.0.1/test?table={table}"


@pytest.mark.variant
@pytest.mark.usefixtures("engine_schemes")
class TestEngineSQLiteStore(StoreContract):
    """A SQLiteStore on a user's Engine passes the whole contract."""

    concurrent_runs = CONNECTION_PATH_RUNS

    @pytest.fixture
    def store_config(self, tmp_path: Path) -> str:
        """A new database file per test, opened through an Engine."""
        return f"sqlaengine-sqlite:///{tmp_path}/runs.db"


@pytest.mark.variant
@pytest.mark.usefixtures("engine_schemes")
class TestEnginePostgresStore(StoreContract):
    """A PostgresStore on a user's Engine and AsyncEngine passes the whole contract."""

    concurrent_runs = CONNECTION_PATH_RUNS

    @pytest.fixture
    def store_config(self, request: pytest.FixtureRequest, tmp_path: Path) -> str:
        """A new table per test, dropped after."""
        return _fresh_server_table(request, "postgresql", tmp_path)


@pytest.mark.variant
@pytest.mark.usefixtures("engine_schemes")
class TestEngineMySQLStore(StoreContract):
    """A MySQLStore on a user's Engine and AsyncEngine passes the whole contract."""

    concurrent_runs = CONNECTION_PATH_RUNS

    @pytest.fixture
    def store_config(self, request: pytest.FixtureRequest, tmp_path: Path) -> str:
        """A new table per test, dropped after."""
        return _fresh_server_table(request, "mysql", tmp_path)
