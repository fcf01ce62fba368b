"""Real memcached processes on free ports, with a tiny blocking text-protocol client.

Every memcached is started as `memcached -u root -l 127.0.0.1 -p P -U 0 -t 1` and polled with
`version` until it answers; a missing binary is a failure, never a skip.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from pathlib import Path

from .process import Proc, binary
from .ready import free_port


class Memcached(Proc):
    """One memcached process; `tls` is the helper client's context for a server run with -Z."""

    name = "memcached"

    def __init__(self, workdir: Path, *extra: str, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.port = free_port()
        argv = [binary("memcached", "apt-get install memcached"), "-u", "root"]
        argv += ["-l", "127.0.0.1", "-p", str(self.port), "-U", "0", "-t", "1", *extra]
        super().__init__(argv, workdir / f"memcached-{self.port}.log")

    @property
    def address(self) -> str:
        """host:port, as MEMCACHE_HOST_PORT takes it."""
        return f"127.0.0.1:{self.port}"

    def ready(self) -> bool:
        """True once `version` answers."""
        try:
            return self.command(b"version").startswith(b"VERSION")
        except OSError:  # ssl.SSLError included
            return False

    def command(self, line: bytes, data: bytes | None = None) -> bytes:
        """One command; its reply up to the terminating line (END, or a single line)."""
        with contextlib.ExitStack() as stack:
            s = stack.enter_context(socket.create_connection(("127.0.0.1", self.port), timeout=2))
            if self.tls is not None:
                s = stack.enter_context(self.tls.wrap_socket(s))
            s.sendall(line + b"\r\n" + (data + b"\r\n" if data is not None else b""))
            out = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return out
                out += chunk
                if out.endswith(b"END\r\n") or (
                    out.endswith(b"\r\n") and not out.startswith((b"VALUE", b"STAT"))
                ):
                    return out

    def value(self, key: str) -> int | None:
        """The integer stored at `key`, None when absent."""
        reply = self.command(b"get " + key.encode())
        if reply == b"END\r\n":
            return None
        return int(reply.split(b"\r\n")[1])

    def ttl(self, key: str) -> int:
        """Seconds left on `key` (meta `mg <key> t`; -1 = never expires, -2 = absent)."""
        reply = self.command(b"mg " + key.encode() + b" t")
        if reply.startswith(b"EN"):
            return -2
        return int(reply.split()[1][1:])

    def stop(self) -> None:
        """Take the server down now (SIGKILL)."""
        self.close()
