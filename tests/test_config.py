"""Config strings: choosing a backend, and the errors for everything else."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, Self

import pytest

import stepstone
from stepstone import ConfigError, Store, _registry, open_store, register_store
from stepstone.stores.memory import MemoryStore


class _Custom(MemoryStore):
    scheme = "custom"

    @classmethod
    def from_config(cls, config: str) -> Self:
        return cls()


@pytest.fixture(autouse=True)
def _clean_registry() -> Iterator[None]:
    saved = dict(_registry._registered)
    yield
    _registry._registered.clear()
    _registry._registered.update(saved)


def test_memory_config_opens_memory_store() -> None:
    """memory:// opens a MemoryStore, a new one each time."""
    a, b = open_store("memory://"), open_store("memory://")
    assert isinstance(a, MemoryStore) and a is not b


def test_named_memory_store_is_shared() -> None:
    """memory://NAME returns the same store for the same name within a process."""
    assert open_store("memory://shared") is open_store("memory://shared")


def test_scheme_is_case_insensitive() -> None:
    """The scheme part is matched without regard to case."""
    assert isinstance(open_store("MEMORY://"), MemoryStore)


@pytest.mark.parametrize(
    ("config", "suggestion"),
    [("sqlit:///x.db", "sqlite"), ("fille:x", "file"), ("cosmo://a/b/c", "cosmos")],
)
def test_unknown_scheme_suggests_closest(config: str, suggestion: str) -> None:
    """An unknown scheme names the closest valid one and lists the valid forms."""
    with pytest.raises(ConfigError) as info:
        open_store(config)
    message = str(info.value)
    assert f"Did you mean {suggestion!r}" in message
    assert "sqlite:///rel.db" in message and "file:///abs/dir" in message


@pytest.mark.parametrize("config", ["", "   ", "no-scheme-here", "://x", "1abc://x", "/abs/path"])
def test_malformed_config_lists_forms(config: str) -> None:
    """A string without a scheme is refused with the list of valid forms."""
    with pytest.raises(ConfigError, match="valid forms|Valid forms|one of"):
        open_store(config)


def test_non_string_config_refused() -> None:
    """A config that is not a str is refused with ConfigError, not a TypeError from deep inside."""
    with pytest.raises(ConfigError, match="must be a str"):
        open_store(42)  # type: ignore[arg-type]


def test_config_error_is_value_error() -> None:
    """ConfigError is a ValueError, so generic handlers still catch it."""
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, stepstone.StepstoneError)


@pytest.mark.parametrize("config", ["memory://x/y", "memory://?a=b", "memory:///path"])
def test_memory_rejects_unknown_parts(config: str) -> None:
    """The memory backend refuses paths and options it does not understand."""
    with pytest.raises(ConfigError, match="memory://"):
        open_store(config)


def test_env_var_chooses_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no argument, STEPSTONE_STORE names the store."""
    monkeypatch.setenv("STEPSTONE_STORE", "memory://from-env")
    assert open_store() is open_store("memory://from-env")


def test_default_is_sqlite_in_cwd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without argument or variable, the store is SQLite in the working directory."""
    monkeypatch.delenv("STEPSTONE_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    with open_store() as store:
        assert store.scheme == "sqlite"
        store.save(stepstone.Checkpoint(run_id="r", step=0, state={}, step_names=("a",)))
    assert (tmp_path / "stepstone.db").exists()


def test_missing_extra_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend whose extra is not installed says which pip install fixes it."""
    monkeypatch.setitem(
        _registry._BUILTIN, "cosmos", ("stepstone_no_such_module:X", "cosmos", "cosmos://...")
    )
    with pytest.raises(ConfigError, match=r"pip install 'stepstone\[cosmos\]'"):
        open_store("cosmos://acct/db/c")


def test_register_store() -> None:
    """A registered scheme opens its class."""
    register_store("custom", _Custom)
    assert isinstance(open_store("custom://anything"), _Custom)
    assert "custom" in stepstone.schemes()


@pytest.mark.parametrize("scheme", ["sqlite", "file", "memory", "cosmos", "SQLITE"])
def test_builtin_scheme_cannot_be_registered_over(scheme: str) -> None:
    """Registering a built-in scheme is refused."""
    with pytest.raises(ConfigError, match="built in"):
        register_store(scheme, _Custom)


def test_register_refuses_non_store() -> None:
    """Only Store subclasses can be registered."""
    with pytest.raises(ConfigError, match="not a stepstone.Store"):
        register_store("thing", dict)  # type: ignore[arg-type]


def _fake_entry_points(monkeypatch: pytest.MonkeyPatch, *eps: EntryPoint) -> None:
    def fake(group: str) -> list[EntryPoint]:
        assert group == "stepstone.stores"
        return list(eps)

    monkeypatch.setattr(_registry, "entry_points", fake)


def test_entry_point_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """A third-party backend registered in the entry-point group opens by its scheme."""
    _fake_entry_points(monkeypatch, EntryPoint("plug", f"{__name__}:_Custom", "stepstone.stores"))
    assert isinstance(open_store("plug://"), _Custom)


def test_entry_point_cannot_hijack_builtin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An entry point named like a built-in scheme is ignored; the built-in wins."""
    _fake_entry_points(
        monkeypatch, EntryPoint("sqlite", "stepstone.stores.memory:MemoryStore", "stepstone.stores")
    )
    with open_store(f"sqlite:///{tmp_path}/x.db") as store:
        assert not isinstance(store, MemoryStore)


def test_store_abc_enforces_methods() -> None:
    """A backend that forgets an abstract method fails when constructed."""

    class Incomplete(Store):
        scheme = "incomplete"

        @classmethod
        def from_config(cls, config: str) -> Self:
            return cls()

        def load(self, run_id: str) -> Any:
            return None

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()  # type: ignore[abstract]
