"""Start a local Azure Cosmos DB emulator for the tests (TEST-ONLY helper).

Usage (e.g. from conftest.py)::

    from cosmos_emulator import cosmos_emulator

    with cosmos_emulator() as emu:
        client = emu.client()                       # azure.cosmos.CosmosClient
        # or: CosmosClient(emu.endpoint, credential=emu.key, **emu.client_kwargs())

``emu`` has ``.endpoint`` (e.g. ``"https://127.0.0.1:8081/"``), ``.key``,
``.host``, ``.port``, ``.mode`` ("container", "process" or "external"),
``.kind`` ("cosmosdb-server", "vnext" or "external") and ``.connection_verify``
(what to pass as the SDK's ``connection_verify``: a CA file path, True or False).

Which emulator is used, in this order:

1. ``STEPSTONE_COSMOS_ENDPOINT`` set: use that already-running emulator or
   account, start nothing. Key from ``AZURE_COSMOS_KEY`` (default: the
   well-known emulator key). ``STEPSTONE_COSMOS_VERIFY`` = a CA file path, or
   ``false`` to skip TLS verification (default: verify).

2. Docker (default): a testcontainers ``DockerContainer`` with host networking
   running ``STEPSTONE_COSMOS_IMAGE`` (default ``stepstone/cosmos-emulator:1.0.1``,
   built locally FROM scratch by ``backends/cosmos/emulator/build-image.sh``;
   ``scripts/start-dockerd.sh`` starts dockerd and builds it). Nothing is pulled
   for that image. It serves HTTPS with a self-signed cert generated at image
   build time; the helper copies the cert out of the container and passes it
   as ``connection_verify``. The port is ``STEPSTONE_COSMOS_PORT`` or, by
   default, a free port picked on 127.0.0.1.

   The official Linux "vNext" emulator is selected on a machine that can pull
   it by setting, e.g.::

       STEPSTONE_COSMOS_IMAGE=mcr.microsoft.com/cosmosdb/linux/azure-cosmos-emulator:vnext-EN20260331

   (or ``:vnext-preview``; any ``azure-cosmos-emulator`` image with a tag that
   starts with ``vnext``). It is started in HTTP mode (``--protocol http`` and
   ``PROTOCOL=http``), port ``STEPSTONE_COSMOS_PORT`` or 8081 (its health
   endpoint also takes port 8080 on the host), with the data explorer and
   telemetry off, and the endpoint is ``http://127.0.0.1:<port>/``. Allow it
   more time to start (``STEPSTONE_COSMOS_STARTUP_TIMEOUT``, default 180 s for
   it, 60 s otherwise).

3. No Docker daemon reachable and ``CI`` unset: fall back to running
   ``node backends/cosmos/emulator/launcher.js`` as a plain subprocess (needs
   ``node`` >= 20 and ``npm ci`` done in that folder). With ``CI`` set (to
   anything but ``false``/``0``) there is no fallback: a clear error is raised.

``STEPSTONE_COSMOS_MODE`` = ``container`` or ``process`` forces one of 2./3.
(explicitly choosing ``process`` is allowed in CI; it is not a fallback).

The Ryuk reaper container cannot be pulled here, so this module sets
``TESTCONTAINERS_RYUK_DISABLED=true`` before importing testcontainers; the
container is removed by the context manager's teardown instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Must happen before testcontainers is imported anywhere: the reaper image
# (testcontainers/ryuk) cannot be pulled without a registry.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

__all__ = [
    "CosmosEmulator",
    "CosmosEmulatorError",
    "cosmos_emulator",
    "DEFAULT_IMAGE",
    "VNEXT_IMAGE",
    "WELL_KNOWN_KEY",
]

#: The documented, public Cosmos DB emulator master key. cosmosdb-server checks
#: no key at all; the official emulators accept this one.
WELL_KNOWN_KEY = (
    "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw=="
)
DEFAULT_IMAGE = "stepstone/cosmos-emulator:1.0.1"
#: A pinned vNext tag, for machines that can pull from mcr.microsoft.com.
VNEXT_IMAGE = "mcr.microsoft.com/cosmosdb/linux/azure-cosmos-emulator:vnext-EN20260331"

REPO_ROOT = Path(__file__).resolve().parent.parent
EMULATOR_DIR = REPO_ROOT / "backends" / "cosmos" / "emulator"

_CERT_IN_IMAGE = "/app/certs/cert.pem"


class CosmosEmulatorError(RuntimeError):
    """The emulator could not be started or reached."""


@dataclasses.dataclass(frozen=True)
class CosmosEmulator:
    endpoint: str
    key: str
    host: str
    port: int
    mode: str  # "container" | "process" | "external"
    kind: str  # "cosmosdb-server" | "vnext" | "external"
    connection_verify: bool | str = True

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``azure.cosmos.CosmosClient`` (sync or aio) besides url/credential.

        azure-cosmos turns TLS verification OFF for any host named
        ``localhost``/``127.0.0.1`` unless an ``ssl_config`` is given
        (``_synchronized_request.py``: ``is_ssl_enabled``), and then urllib3
        warns ``InsecureRequestWarning`` on every request. With a CA file we
        pass ``ssl_config`` so the emulator's self-signed cert is really
        verified and nothing warns. A fresh ``SSLConfiguration`` per client:
        the SDK mutates it.
        """
        kwargs: dict[str, Any] = {}
        if isinstance(self.connection_verify, str):
            from azure.cosmos import SSLConfiguration

            ssl = SSLConfiguration()
            ssl.SSLCaCerts = self.connection_verify
            kwargs["ssl_config"] = ssl
            kwargs["connection_verify"] = self.connection_verify
        elif self.connection_verify is False:
            kwargs["connection_verify"] = False
        if self.kind != "external":
            # A local emulator is a single region at a fixed address: don't let
            # the SDK follow the account's advertised locations elsewhere, and
            # fail fast instead of the SDK's long default retries.
            kwargs["enable_endpoint_discovery"] = False
            kwargs["connection_timeout"] = 10
        return kwargs

    def client(self, **overrides: Any) -> Any:
        from azure.cosmos import CosmosClient

        return CosmosClient(
            self.endpoint, credential=self.key, **{**self.client_kwargs(), **overrides}
        )


def _env_true(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _is_vnext(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    if "/" in tag:  # "host:port/repo" without a tag
        name, tag = image, ""
    return "azure-cosmos-emulator" in name and tag.startswith("vnext")


def _startup_timeout(default: float) -> float:
    return float(os.environ.get("STEPSTONE_COSMOS_STARTUP_TIMEOUT", default))


def _wait_ready(
    emu: CosmosEmulator, timeout: float, alive: Callable[[], object] = lambda: None
) -> None:
    """Wait until the port answers and the SDK can list databases.

    ``alive()`` raises if the emulator process/container died meanwhile.
    """
    deadline = time.monotonic() + timeout
    while not _port_open(emu.host, emu.port):
        alive()
        if time.monotonic() > deadline:
            raise CosmosEmulatorError(
                f"Cosmos emulator port {emu.host}:{emu.port} did not open within {timeout:.0f}s"
            )
        time.sleep(0.1)
    last_error: BaseException | None = None
    while True:
        alive()
        try:
            with warnings.catch_warnings():
                # e.g. InsecureRequestWarning with connection_verify=False:
                # the probe must not fail on a warnings-as-errors filter.
                warnings.simplefilter("ignore")
                client = emu.client(retry_total=0, connection_timeout=5)
                list(client.list_databases())
            return
        except Exception as exc:  # noqa: BLE001 - the SDK raises many types while booting
            last_error = exc
        if time.monotonic() > deadline:
            raise CosmosEmulatorError(
                f"Cosmos emulator at {emu.endpoint} did not answer list_databases "
                f"within {timeout:.0f}s: {last_error!r}"
            )
        time.sleep(0.25)


# --------------------------------------------------------------------------
# external
# --------------------------------------------------------------------------
def _external(endpoint: str) -> CosmosEmulator:
    from urllib.parse import urlparse

    parsed = urlparse(endpoint)
    if not parsed.scheme or not parsed.hostname:
        raise CosmosEmulatorError(f"STEPSTONE_COSMOS_ENDPOINT is not a URL: {endpoint!r}")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    verify_env = os.environ.get("STEPSTONE_COSMOS_VERIFY", "").strip()
    verify: bool | str
    if not verify_env or verify_env.lower() in ("1", "true", "yes"):
        verify = True
    elif verify_env.lower() in ("0", "false", "no"):
        verify = False
    else:
        verify = verify_env
    return CosmosEmulator(
        endpoint=endpoint if endpoint.endswith("/") else endpoint + "/",
        key=os.environ.get("AZURE_COSMOS_KEY") or WELL_KNOWN_KEY,
        host=parsed.hostname,
        port=port,
        mode="external",
        kind="external",
        connection_verify=verify,
    )


# --------------------------------------------------------------------------
# docker
# --------------------------------------------------------------------------
def _docker_available() -> bool:
    try:
        import docker  # installed with testcontainers
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=5)
        try:
            client.ping()
        finally:
            client.close()
        return True
    except Exception:  # noqa: BLE001 - any failure of the probe means: not up yet
        return False


def _image_present(image: str) -> bool:
    import docker

    client = docker.from_env(timeout=10)
    try:
        client.images.get(image)
        return True
    except docker.errors.ImageNotFound:
        return False
    finally:
        client.close()


def _copy_file_out(container: Any, path: str, dest: Path) -> None:
    stream, _ = container.get_wrapped_container().get_archive(path)
    data = io.BytesIO(b"".join(stream))
    with tarfile.open(fileobj=data) as tar:
        member = tar.getmembers()[0]
        extracted = tar.extractfile(member)
        if extracted is None:
            raise CosmosEmulatorError(f"{path} in the container is not a file")
        dest.write_bytes(extracted.read())


#: The pid of the test session that started an emulator container.
_OWNER_LABEL = "org.stepstone.owner-pid"


def _reap_orphans() -> None:
    """Remove emulator containers whose test session is gone (killed before its cleanup).

    A session killed by a signal (a timeout, ^C twice, CI's kill) never runs the
    ``finally`` that stops its container; left alone, each one holds a gigabyte. Containers
    of sessions still running (another engineer's, in parallel) are kept.
    """
    import docker

    client = docker.from_env(timeout=10)
    try:
        for stale in client.containers.list(
            all=True, filters={"label": "org.stepstone.cosmos-emulator=test"}
        ):
            owner = stale.labels.get(_OWNER_LABEL, "")
            if not owner.isdigit() or _pid_alive(int(owner)):
                continue  # a live session's, or one this rule cannot judge: kept
            with contextlib.suppress(Exception):  # gone already, or being removed
                stale.remove(force=True)
    finally:
        client.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


@contextlib.contextmanager
def _container(image: str) -> Iterator[CosmosEmulator]:
    from testcontainers.core.container import DockerContainer

    vnext = _is_vnext(image)
    if not vnext and image == DEFAULT_IMAGE and not _image_present(image):
        raise CosmosEmulatorError(
            f"Docker image {image} is not built (it cannot be pulled). Run "
            "scripts/start-dockerd.sh or backends/cosmos/emulator/build-image.sh first."
        )

    host = "127.0.0.1"
    if vnext:
        port = int(os.environ.get("STEPSTONE_COSMOS_PORT", "8081"))
        container = (
            DockerContainer(image, command=["--protocol", "http", "--port", str(port)])  # type: ignore[arg-type]
            .with_env("PROTOCOL", "http")
            .with_env("PORT", str(port))
            .with_env("ENABLE_EXPLORER", "false")
            .with_env("ENABLE_TELEMETRY", "false")
        )
        timeout = _startup_timeout(180)
    else:
        port = int(os.environ.get("STEPSTONE_COSMOS_PORT") or _free_port())
        container = (
            DockerContainer(image)
            .with_env("COSMOS_HOST", host)
            .with_env("COSMOS_PORT", str(port))
            .with_env("COSMOS_PROTOCOL", "https")
        )
        timeout = _startup_timeout(60)
    container = container.with_kwargs(
        network_mode="host",
        labels={"org.stepstone.cosmos-emulator": "test", _OWNER_LABEL: str(os.getpid())},
    )
    _reap_orphans()

    if _port_open(host, port):
        raise CosmosEmulatorError(
            f"port {host}:{port} is already in use; set STEPSTONE_COSMOS_PORT to a free port"
        )

    with tempfile.TemporaryDirectory(prefix="stepstone-cosmos-") as tmp:
        container.start()
        try:

            def alive() -> None:
                container.reload()
                if container.status not in ("created", "running"):
                    out, err = container.get_logs()
                    raise CosmosEmulatorError(
                        f"emulator container exited ({container.status}):\n"
                        f"{out.decode(errors='replace')}{err.decode(errors='replace')}"
                    )

            if vnext:
                emu = CosmosEmulator(
                    f"http://{host}:{port}/", WELL_KNOWN_KEY, host, port, "container", "vnext", True
                )
            else:
                # The port must be open before the cert can be trusted: the
                # launcher reads it first thing, so the file is there by now
                # or the container already died.
                cert = Path(tmp) / "cert.pem"
                deadline = time.monotonic() + timeout
                while True:
                    alive()
                    try:
                        _copy_file_out(container, _CERT_IN_IMAGE, cert)
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)
                emu = CosmosEmulator(
                    f"https://{host}:{port}/",
                    WELL_KNOWN_KEY,
                    host,
                    port,
                    "container",
                    "cosmosdb-server",
                    str(cert),
                )
            _wait_ready(emu, timeout, alive)
            yield emu
        finally:
            container.stop()


# --------------------------------------------------------------------------
# plain process
# --------------------------------------------------------------------------
@contextlib.contextmanager
def _process() -> Iterator[CosmosEmulator]:
    node = shutil.which("node")
    if node is None:
        raise CosmosEmulatorError(
            "neither Docker nor `node` is available to run the Cosmos emulator"
        )
    if not (EMULATOR_DIR / "node_modules" / "@vercel" / "cosmosdb-server").is_dir():
        raise CosmosEmulatorError(f"run `npm ci` in {EMULATOR_DIR} first (node_modules is missing)")

    host = "127.0.0.1"
    port = int(os.environ.get("STEPSTONE_COSMOS_PORT") or _free_port())
    if _port_open(host, port):
        raise CosmosEmulatorError(
            f"port {host}:{port} is already in use; set STEPSTONE_COSMOS_PORT to a free port"
        )
    env = {**os.environ, "COSMOS_HOST": host, "COSMOS_PORT": str(port), "COSMOS_PROTOCOL": "https"}
    timeout = _startup_timeout(60)

    with tempfile.TemporaryFile(mode="w+b") as log:
        proc = subprocess.Popen(
            [node, str(EMULATOR_DIR / "launcher.js")],
            cwd=EMULATOR_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def output() -> str:
            log.seek(0)
            return log.read().decode(errors="replace")

        def alive() -> None:
            if proc.poll() is not None:
                raise CosmosEmulatorError(
                    f"emulator process exited with {proc.returncode}:\n{output()}"
                )

        try:
            cert: str | None = None
            deadline = time.monotonic() + timeout
            while cert is None:
                alive()
                for line in output().splitlines():
                    if line.startswith("TLS certificate: "):
                        cert = line[len("TLS certificate: ") :].strip()
                if cert is None:
                    if time.monotonic() > deadline:
                        raise CosmosEmulatorError(
                            "emulator printed no certificate path within "
                            f"{timeout:.0f}s:\n{output()}"
                        )
                    time.sleep(0.05)
            emu = CosmosEmulator(
                f"https://{host}:{port}/",
                WELL_KNOWN_KEY,
                host,
                port,
                "process",
                "cosmosdb-server",
                cert,
            )
            _wait_ready(emu, max(1.0, deadline - time.monotonic()), alive)
            yield emu
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


# --------------------------------------------------------------------------
@contextlib.contextmanager
def cosmos_emulator() -> Iterator[CosmosEmulator]:
    """Yield a running emulator (see the module docstring for how it is chosen)."""
    endpoint = os.environ.get("STEPSTONE_COSMOS_ENDPOINT", "").strip()
    if endpoint:
        emu = _external(endpoint)
        _wait_ready(emu, _startup_timeout(60))
        yield emu
        return

    mode = os.environ.get("STEPSTONE_COSMOS_MODE", "auto").strip().lower() or "auto"
    if mode not in ("auto", "container", "process"):
        raise CosmosEmulatorError(
            f"STEPSTONE_COSMOS_MODE must be auto, container or process, not {mode!r}"
        )
    image = os.environ.get("STEPSTONE_COSMOS_IMAGE", "").strip() or DEFAULT_IMAGE

    if mode == "process":
        manager = _process()
    elif _docker_available():
        manager = _container(image)
    elif mode == "container" or _env_true("CI"):
        raise CosmosEmulatorError(
            "No Docker daemon answers (checked with docker.from_env().ping()), and the "
            "Cosmos emulator must run in a container here"
            + (
                " because CI is set"
                if _env_true("CI")
                else " because STEPSTONE_COSMOS_MODE=container"
            )
            + ". Run scripts/start-dockerd.sh to install/start dockerd and build "
            f"{DEFAULT_IMAGE}, or set STEPSTONE_COSMOS_ENDPOINT to a running emulator."
        )
    else:
        manager = _process()

    with manager as emu:
        yield emu
