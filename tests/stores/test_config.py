"""Config strings: choosing a backend, and the errors for everything else."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote, unquote

import pytest

import stepstone
from stepstone import ConfigError, Store, _registry, open_store, register_store
from stepstone._redact import redact, redact_url, secrets_of
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


# --- secrets: one redaction routine ----------------------------------------------------

# Passwords a careless operator pastes into a URL as they are, or percent-encoded.
HOSTILE_PASSWORDS = [
    "p@ss/w:rd%",
    "hunter2@evil.example",
    "a/b/c@d:e",
    "s3cr:et%41%zz",
    "pässwörd€:x",
    "%40%2F%3A%25",
    "tr@il@",
]


def _spellings(password: str) -> list[str]:
    """Every form in which ``password`` could leak: raw, encoded, decoded."""
    forms = {password, quote(password, safe=""), unquote(password)}
    return [f for f in forms if len(f) >= 4]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hostile_configs(password: str, port: int) -> list[str]:
    """Config strings of every scheme that carry ``password`` raw and percent-encoded."""
    configs = []
    for secret in (password, quote(password, safe="")):
        configs += [
            f"postgresql://postgres:{secret}@127.0.0.1:{port}/test?connect_timeout=2",
            f"mysql://root:{secret}@127.0.0.1:{port}/test?connect_timeout=2",
            f"memory://alice:{secret}@x/",
            f"file://alice:{secret}@host/tmp/x",
            f"sqlite://alice:{secret}@host/x.db",
            f"cosmos://alice:{secret}@127.0.0.1:{port}/db/c",
            f"bogus://alice:{secret}@h/x",
            f"postgresql://postgres:{secret}@127.0.0.1:99999/test",
        ]
    return configs


@pytest.mark.server
@pytest.mark.parametrize("password", HOSTILE_PASSWORDS)
def test_hostile_password_never_in_open_store_errors(
    password: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A password with raw @ / : % or non-ASCII never appears in any open_store error."""
    monkeypatch.delenv("AZURE_COSMOS_KEY", raising=False)
    monkeypatch.delenv("AZURE_COSMOS_CONNECTION_STRING", raising=False)
    port = _closed_port()
    for config in _hostile_configs(password, port):
        try:
            store = open_store(config)
        except stepstone.StepstoneError as exc:
            text = f"{exc} {exc!r}"
        else:
            text = f"{store!r} {getattr(store, 'where', '')}"
            store.close()
        for leaked in _spellings(password):
            assert leaked not in text, (config, text)


@pytest.mark.parametrize("password", ["p@ss/w", "x/y@z"])
def test_raw_at_or_slash_in_password_is_refused_with_advice(password: str) -> None:
    """A raw @ or / in a password is a ConfigError that says how to encode it."""
    with pytest.raises(ConfigError, match="percent-encode it") as caught:
        open_store(f"postgresql://u:{password}@127.0.0.1/db")
    assert password not in str(caught.value)
    assert "postgresql://u:***@127.0.0.1/db" in str(caught.value)


@pytest.mark.server
def test_hostile_password_never_in_repr_of_an_open_store() -> None:
    """An open SQL store's repr and 'where' hide a password with : % and non-ASCII."""
    password = "s3cr:et%41%zz-pässwörd"
    try:
        import psycopg

        psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", connect_timeout=3).close()
    except Exception as exc:  # noqa: BLE001 - a server that fails in any way is unavailable: skip, loudly
        from stepstone.testing import backend_unavailable

        backend_unavailable(f"PostgreSQL on 127.0.0.1:5432: {exc}")
    encoded = quote(password, safe="")
    with open_store(f"postgresql://postgres:{encoded}@127.0.0.1:5432/test") as store:
        text = f"{store!r} {getattr(store, 'where', '')} {store.doctor()!r}"
    for leaked in _spellings(password):
        assert leaked not in text


@pytest.mark.parametrize("port", ["99999", "0", "65536", "abc", "-1", "1e3"])
def test_bad_port_is_a_config_error(port: str) -> None:
    """A port outside 1-65535 is a ConfigError naming the port, for every scheme."""
    for config in (
        f"postgresql://u@h:{port}/db",
        f"mysql://u@h:{port}/db",
        f"cosmos://h:{port}/db/c",
    ):
        with pytest.raises(ConfigError, match="is not a port"):
            open_store(config)


def test_redact_url_masks_password_and_secret_options_only() -> None:
    """redact_url masks the password and secret-named options, nothing else."""
    cases = {
        "postgresql://u:p@ss/w:rd%@host:5432/db?table=t": "postgresql://u:***@host:5432/db?table=t",
        "postgresql://u:p%40ss@h/db": "postgresql://u:***@h/db",
        "mysql://root@h/db": "mysql://root@h/db",
        "cosmos://h/db/c?token=abc&x=1&auth=key": "cosmos://h/db/c?token=***&x=1&auth=key",
        "cosmos://h/db/c?AccountKey=abc&sig=x%3D&client_secret=s": (
            "cosmos://h/db/c?AccountKey=***&sig=***&client_secret=***"
        ),
        "sqlite:///x.db?busy_timeout=5": "sqlite:///x.db?busy_timeout=5",
        "file:///home/a@b/dir": "file:///home/a@b/dir",
        "memory://alice:hunter2@x/?key=s3cr3tk3y": "memory://alice:***@x/?key=***",
    }
    for config, expected in cases.items():
        assert redact_url(config) == expected, config


def test_redaction_keeps_help_text_intact() -> None:
    """Error help text (USER[:PASSWORD]@HOST forms, option lists) is never garbled."""
    forms = _registry._valid_forms()
    assert redact(forms) == forms
    help_text = (
        "forms: postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE or "
        "sqlite:///rel.db[?synchronous=full|normal&busy_timeout=ms]; pass table= and "
        "connect_timeout= as arguments; a key= option is refused"
    )
    assert redact(help_text, ["hunter2-long"]) == help_text
    with pytest.raises(ConfigError) as caught:
        open_store("bogus://alice:hunter2-long@h/x")
    assert forms in str(caught.value)
    assert "hunter2-long" not in str(caught.value)


def test_redact_free_text_masks_known_secrets_and_urls() -> None:
    """redact() masks every URL's password, connection-string keys and known secrets."""
    text = (
        "failed: postgresql://u:p@ss/w@h/db refused; AccountKey=abc123==; "
        "the password was longsecret99 (really)"
    )
    masked = redact(text, secrets_of("postgresql://u:longsecret99@h/db"))
    assert masked == (
        "failed: postgresql://u:***@h/db refused; AccountKey=***; the password was *** (really)"
    )
    # A short secret is masked where it sits, never blindly across the text.
    assert redact("run ab done", secrets_of("postgresql://u:ab@h/db")) == "run ab done"
