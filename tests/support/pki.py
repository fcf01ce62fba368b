"""The test PKI, made with the openssl CLI (P-256 keys: milliseconds, where RSA takes seconds).

Two CAs and their leaves, each a (certificate, key) pair of PEM files:
  server     127.0.0.1 / localhost, signed by `ca`         (serverAuth)
  server2    the same names, signed by `ca2`               (serverAuth)
  elsewhere  DNS elsewhere.test only, signed by `ca`       (a hostname mismatch)
  client     DNS client.example.com, signed by `ca`        (clientAuth)
  other      DNS other.example.com, signed by `ca`         (clientAuth, a SAN mismatch)
  gateway    envoy-gateway (Envoy Gateway's xDS server) and 127.0.0.1 / localhost, by `ca`
  ratelimit  *.envoy-gateway-system and 127.0.0.1 / localhost, by `ca` (serverAuth and
             clientAuth: Envoy Gateway gives its rate-limit pod one certificate for both)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc

EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
LOCAL = "DNS:localhost,IP:127.0.0.1"


class Pki:
    """Certificates under `root` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        if shutil.which("openssl") is None:
            raise AssertionError("the openssl CLI is needed to make test certificates")
        self.root = root
        self.ca = self._ca("ca")
        self.ca2 = self._ca("ca2")
        self.server = self._leaf("server", self.ca, LOCAL, "serverAuth")
        self.server2 = self._leaf("server2", self.ca2, LOCAL, "serverAuth")
        self.elsewhere = self._leaf("elsewhere", self.ca, "DNS:elsewhere.test", "serverAuth")
        self.client = self._leaf("client", self.ca, "DNS:client.example.com", "clientAuth")
        self.other = self._leaf("other", self.ca, "DNS:other.example.com", "clientAuth")
        self.gateway = self._leaf("gateway", self.ca, f"DNS:envoy-gateway,{LOCAL}", "serverAuth")
        self.ratelimit = self._leaf(
            "ratelimit", self.ca, f"DNS:*.envoy-gateway-system,{LOCAL}", "serverAuth,clientAuth"
        )

    def _run(self, *args: str) -> None:
        subprocess.run(["openssl", *args], cwd=self.root, check=True, capture_output=True)

    def _ca(self, name: str) -> Path:
        self._run(
            "req", "-x509", *EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.pem",
            "-days", "2", "-subj", f"/CN=ratelimitd test {name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        return self.root / f"{name}.pem"

    def _leaf(self, name: str, ca: Path, san: str, usage: str) -> tuple[Path, Path]:
        ext = self.root / f"{name}.ext"
        ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
        self._run(
            "req", *EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        )  # fmt: skip
        self._run(
            "x509", "-req", "-in", f"{name}.csr", "-CA", ca.name, "-CAkey", ca.stem + ".key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", ext.name,
        )  # fmt: skip
        return self.root / f"{name}.pem", self.root / f"{name}.key"

    def server_env(self) -> dict[str, str]:
        """The daemon's environment for a TLS gRPC listener with the `server` certificate."""
        return {
            "GRPC_SERVER_USE_TLS": "true",
            "GRPC_SERVER_TLS_CERT": str(self.server[0]),
            "GRPC_SERVER_TLS_KEY": str(self.server[1]),
        }

    def creds(self, ca: Path, client: tuple[Path, Path] | None = None) -> grpc.ChannelCredentials:
        """gRPC client credentials trusting `ca`, presenting `client` when given."""
        if client is None:
            return grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
        return grpc.ssl_channel_credentials(
            root_certificates=ca.read_bytes(),
            private_key=client[1].read_bytes(),
            certificate_chain=client[0].read_bytes(),
        )
