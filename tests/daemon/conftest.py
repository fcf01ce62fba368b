"""Fixtures that run the real daemon as a subprocess on free ports."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from support import REPO, DaemonProcess, daemon_environment, free_port, wait_for  # noqa: F401


class Certs:
    """A test PKI made with the openssl CLI: two CAs, servers, clients."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = self._ca("ca")
        self.ca2 = self._ca("ca2")
        self.server = self._leaf("server", self.ca, "DNS:localhost,IP:127.0.0.1", "serverAuth")
        self.server2 = self._leaf("server2", self.ca2, "DNS:localhost,IP:127.0.0.1", "serverAuth")
        self.client = self._leaf("client", self.ca, "DNS:client.example.com", "clientAuth")
        self.other = self._leaf("other", self.ca, "DNS:other.example.com", "clientAuth")

    def _run(self, *args: str) -> None:
        subprocess.run(["openssl", *args], cwd=self.root, check=True, capture_output=True)

    def _ca(self, name: str) -> Path:
        self._run(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
            "-subj", f"/CN=ratelimitd test {name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        return self.root / f"{name}.pem"

    def _leaf(self, name: str, ca: Path, san: str, usage: str) -> tuple[Path, Path]:
        ext = self.root / f"{name}.ext"
        ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
        self._run(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        )  # fmt: skip
        self._run(
            "x509", "-req", "-in", f"{name}.csr", "-CA", ca.name, "-CAkey", ca.stem + ".key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", ext.name,
        )  # fmt: skip
        return self.root / f"{name}.pem", self.root / f"{name}.key"

    def creds(self, ca: Path, client: tuple[Path, Path] | None = None) -> grpc.ChannelCredentials:
        """Client credentials trusting `ca`, presenting `client` when given."""
        if client is None:
            return grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
        return grpc.ssl_channel_credentials(
            root_certificates=ca.read_bytes(),
            private_key=client[1].read_bytes(),
            certificate_chain=client[0].read_bytes(),
        )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """The test PKI (made once per module)."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl CLI is needed to make test certificates")
    return Certs(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def daemon_env(tmp_path: Path) -> dict[str, str]:
    """Environment for a daemon on free ports serving tmp_path/runtime/config/*.yaml."""
    return daemon_environment(tmp_path / "runtime")


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Start daemons with `start_daemon(env, wait=True)`; all are killed at teardown."""
    started: list[DaemonProcess] = []

    def start(env: dict[str, str], wait: bool = True) -> DaemonProcess:
        d = DaemonProcess(env, tmp_path / f"daemon{len(started)}.log")
        started.append(d)
        return d.wait_ready() if wait else d

    yield start
    for d in started:
        d.close()
