"""The memcached backend: decide on one multi-get, count in the background (section 9).

Per request the limiter hands over `Op`s (key, hits, unit seconds). The backend sends ONE multi-get
for all keys (per node, all nodes at once), takes a missing key as 0 and a value as a
base-10 int32 (anything else: 0, logged), and returns `value + hits` per op, so the
limiter decides with `before = value`: the decision is made before the increment, as the
reference does. The increments then run in a background task the request does not wait
for (the ops of every request of one loop iteration form one batch, `flush()` awaits
them): `incr key hits`; on NOT_FOUND `add key 0 <unit + jitter> <hits>`; on NOT_STORED (a
concurrent add won) `incr` again. The TTL is set only by the add. Concurrent requests can
therefore briefly exceed a limit: they all read the same value before any increment lands.

Fails open. A multi-get error (connection refused, timeout, a malformed key) is logged and
counted, and the counters of the keys it covered read as 0; the request is still decided.
A key over 250 bytes or holding a byte <= 0x20 or 0x7f is rejected before anything is
sent, failing the whole get open, as gomemcache's ErrMalformedKey does. (gomemcache keeps
the values of the nodes that did answer when another node fails; so does this backend.)

Nodes. MEMCACHE_HOST_PORT in the given order, or the targets of MEMCACHE_SRV sorted as
`target:port` strings (refreshed every MEMCACHE_SRV_REFRESH when > 0). A key goes to node
`crc32(key) % len(nodes)`, gomemcache's ServerList selector, so Go and Python instances
given the same list use the same node for a key. Python's stdlib has no SRV lookup: a
minimal DNS client (one UDP query to the first resolv.conf nameserver, TCP on truncation)
does it.

Connections. Each node has max(1, MEMCACHE_MAX_IDLE_CONNS) pipelined text-protocol
connections, dialled at `connect()` and used round-robin; replies come back in command
order, so many requests share one connection without waiting for each other, and the
commands of one loop iteration leave in one write. An operation gets `timeout`
(gomemcache's default, 500 ms; detected within 1.25 x) for its reply; past it the
connection is presumed hung, closed, and its pending operations fail. A node that refuses
a dial is not dialled again for a short backoff, during which its operations fail at once
(and so fail open) instead of each request paying a dial.

Expiry. memcached reads an exptime over 30 days as an absolute Unix time. The reference
sends unit + jitter as is, so a MONTH key with jitter, or any YEAR key, is stored already
expired and never counts; here such a TTL is sent as now + TTL instead.

Health. `connect()` resolves the nodes, dials them (an unreachable node is logged, not
fatal: the backend fails open) and sets the `backend` component OK. It stays OK when
memcached goes away, since every request is still answered. (The reference never turns
health OK with memcache, a regression this backend does not copy.)

Stats, scope ratelimit.memcache, tags serialized as gostats does for statsd:
`multiget.__code=success|error`, `increment.__code=success|miss|error`,
`add.__code=success|error|not_stored`, `keys_requested`, `keys_found`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import re
import socket
import ssl
import struct
import time
import zlib
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING

from .base import ONLY_FIXED_WINDOW, BackendError, Op

if TYPE_CHECKING:
    from ..health import Health
    from ..settings import MemcacheSettings, Settings
    from ..stats import StatsStore

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 0.5  # gomemcache DefaultTimeout: dial and each operation
CLOSE_GRACE = 2.0  # close() waits this long for background increments
MAX_KEY_LENGTH = 250
_RELATIVE_EXPIRY_MAX = 30 * 24 * 3600  # above this memcached reads an absolute time
_REDIAL_MIN = 0.05
_REDIAL_MAX = 1.0
_INT32_MAX = 2**31 - 1
_SRV_NAME = re.compile(r"^_(.+?)\._(.+?)\.(.+)$")
# Bytes gomemcache's legalKey refuses: controls, space and DEL.
_ILLEGAL_KEY_BYTES = re.compile(rb"[\x00-\x20\x7f]")

_STAT_NAMES = (
    "multiget.__code=success",
    "multiget.__code=error",
    "increment.__code=success",
    "increment.__code=miss",
    "increment.__code=error",
    "add.__code=success",
    "add.__code=error",
    "add.__code=not_stored",
    "keys_requested",
    "keys_found",
)


def pick_node(key: bytes, nodes: int) -> int:
    """gomemcache's ServerList.PickServer: crc32 (IEEE) of the key modulo the node count."""
    if nodes == 1:
        return 0
    return zlib.crc32(key) % nodes


def legal_key(key: bytes) -> bool:
    """gomemcache's legalKey: at most 250 bytes, no control characters, space or DEL."""
    return len(key) <= MAX_KEY_LENGTH and _ILLEGAL_KEY_BYTES.search(key) is None


def parse_int32(raw: bytes) -> int | None:
    """Go's strconv.ParseInt(s, 10, 32), or None where Go reports an error."""
    text = raw.decode("ascii", "replace")
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or not body.isascii() or not body.isdigit():
        return None
    value = int(text)
    if not -(2**31) <= value <= _INT32_MAX:
        return None
    return value


def _host_port(item: str) -> tuple[str, int]:
    host, sep, port = item.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise BackendError(f"invalid memcache address {item!r} (expected host:port)")
    return host.strip("[]"), int(port)


class MemcacheStats:
    """The ratelimit.memcache.* counters."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(_STAT_NAMES, 0)

    def inc(self, name: str, n: int = 1) -> None:
        """Add `n` to one counter (short name, e.g. `add.__code=success`)."""
        self.counts[name] += n

    def register(self, stats: StatsStore) -> None:
        """Expose every counter as a gauge under ratelimit.memcache."""
        for name in _STAT_NAMES:
            stats.add_gauge(f"ratelimit.memcache.{name}", lambda n=name: self.counts[n])  # type: ignore[misc]


# -- the text protocol --------------------------------------------------------------------

_GET, _LINES = 0, 1


class _Pending:
    """One pipelined operation: a multi-get or `count` single-line replies."""

    __slots__ = ("count", "deadline", "future", "kind", "lines", "values")

    def __init__(
        self, kind: int, count: int, future: asyncio.Future[object], deadline: float
    ) -> None:
        self.kind = kind
        self.count = count
        self.future = future
        self.deadline = deadline
        self.lines: list[bytes] = []
        self.values: dict[bytes, bytes] = {}


class MemcacheProtocolError(BackendError):
    """A reply the text protocol does not allow here; the connection is dropped."""


class _Connection(asyncio.Protocol):
    """A pipelined memcached text-protocol connection: replies resolve in command order.

    The operations of one event-loop iteration go out in one write (`call_soon` flush),
    so concurrent requests share syscalls. One watchdog timer per connection, not one per
    operation, checks the oldest operation's deadline every timeout/4: a hung connection
    is detected between 1 and 1.25 timeouts after the operation was sent.
    """

    def __init__(self, label: str, timeout: float) -> None:
        self.label = label
        self.timeout = timeout
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buf = bytearray()
        self._pending: collections.deque[_Pending] = collections.deque()
        self._out: list[bytes] = []
        self._loop = asyncio.get_running_loop()
        self._watchdog: asyncio.TimerHandle | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(BackendError(f"memcache {self.label}: connection lost ({exc or 'closed'})"))

    def data_received(self, data: bytes) -> None:
        self._buf += data
        try:
            self._parse()
        except MemcacheProtocolError as exc:
            self._fail(exc)

    # Requests
    def request(self, payload: bytes, kind: int, count: int) -> asyncio.Future[object]:
        """Queue `payload` for this iteration's write; the future of its replies."""
        loop = self._loop
        fut: asyncio.Future[object] = loop.create_future()
        if self.closed or self.transport is None:
            fut.set_exception(BackendError(f"memcache {self.label}: connection closed"))
            return fut
        self._pending.append(_Pending(kind, count, fut, loop.time() + self.timeout))
        if not self._out:
            loop.call_soon(self._flush)
        self._out.append(payload)
        if self._watchdog is None:
            self._watchdog = loop.call_later(self.timeout / 4, self._watch)
        return fut

    def _flush(self) -> None:
        out = self._out
        self._out = []
        if out and not self.closed and self.transport is not None:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    def _watch(self) -> None:
        self._watchdog = None
        if not self._pending:
            return
        if self._pending[0].deadline <= self._loop.time():
            self._fail(BackendError(f"memcache {self.label}: timeout after {self.timeout}s"))
            return
        self._watchdog = self._loop.call_later(self.timeout / 4, self._watch)

    def close(self) -> None:
        """Close the connection; pending operations fail."""
        self._fail(BackendError(f"memcache {self.label}: connection closed"))

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        self._out = []
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self.transport is not None:
            self.transport.abort()
        while self._pending:
            p = self._pending.popleft()
            if not p.future.done():
                p.future.set_exception(exc)
                # Nobody may await it any more (an abandoned background op).
                p.future.exception()

    def _done(self, p: _Pending, result: object) -> None:
        self._pending.popleft()
        if not p.future.done():
            p.future.set_result(result)

    def _parse(self) -> None:
        buf = self._buf
        pos = 0
        try:
            while self._pending:
                p = self._pending[0]
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    return
                line = bytes(buf[pos:end])
                if p.kind == _LINES:
                    pos = end + 2
                    p.lines.append(line)
                    if len(p.lines) == p.count:
                        self._done(p, p.lines)
                    continue
                if line == b"END":
                    pos = end + 2
                    self._done(p, p.values)
                    continue
                if not line.startswith(b"VALUE "):
                    # ERROR / CLIENT_ERROR / SERVER_ERROR: the stream may be out of step.
                    raise MemcacheProtocolError(
                        f"memcache {self.label}: get failed: {line.decode(errors='replace')}"
                    )
                parts = line.split()
                if len(parts) < 4 or not parts[3].isdigit():
                    raise MemcacheProtocolError(f"memcache {self.label}: bad VALUE line {line!r}")
                size = int(parts[3])
                if len(buf) < end + 2 + size + 2:
                    return  # the data block is not complete yet
                start = end + 2
                p.values[parts[1]] = bytes(buf[start : start + size])
                pos = start + size + 2
        finally:
            if pos:
                del buf[:pos]
        if buf and not self._pending:
            raise MemcacheProtocolError(
                f"memcache {self.label}: unexpected data {bytes(buf[:80])!r}"
            )


async def _open(
    host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float
) -> _Connection:
    loop = asyncio.get_running_loop()
    label = f"{host}:{port}"
    async with asyncio.timeout(timeout):
        _, conn = await loop.create_connection(
            lambda: _Connection(label, timeout),
            host,
            port,
            ssl=ssl_context,
            server_hostname=host if ssl_context is not None else None,
        )
    sock = conn.transport.get_extra_info("socket") if conn.transport else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


class _Node:
    """One memcached server: a few pipelined connections, dialled lazily, with backoff."""

    def __init__(
        self,
        address: str,
        size: int,
        ssl_context: ssl.SSLContext | None,
        timeout: float,
    ) -> None:
        self.address = address
        self.host, self.port = _host_port(address)
        # SRV targets end in a dot (as Go prints them, and they sort with it); /etc/hosts
        # and certificate names are matched without it.
        self.host = self.host.removesuffix(".")
        self.ssl_context = ssl_context
        self.timeout = timeout
        self._conns: list[_Connection | None] = [None] * max(1, size)
        self._dialing: list[asyncio.Future[_Connection] | None] = [None] * len(self._conns)
        self._next = 0
        self._down_until = 0.0
        self._backoff = _REDIAL_MIN

    def _slot(self) -> int:
        i = self._next
        self._next = (i + 1) % len(self._conns)
        return i

    async def connection(self) -> _Connection:
        """A live connection (round-robin over the slots); BackendError when unreachable."""
        i = self._slot()
        conn = self._conns[i]
        if conn is not None and not conn.closed:
            return conn
        dialing = self._dialing[i]
        if dialing is None:
            if time.monotonic() < self._down_until:
                raise BackendError(f"memcache {self.address}: unreachable (backing off)")
            dialing = self._dialing[i] = asyncio.ensure_future(self._dial(i))
        return await asyncio.shield(dialing)

    async def _dial(self, i: int) -> _Connection:
        try:
            conn = await _open(self.host, self.port, self.ssl_context, self.timeout)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            self._down_until = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, _REDIAL_MAX)
            raise BackendError(f"memcache {self.address}: {exc or type(exc).__name__}") from exc
        finally:
            self._dialing[i] = None
        self._backoff = _REDIAL_MIN
        self._conns[i] = conn
        return conn

    async def warm(self) -> None:
        """Dial every connection slot now (startup), not on first use."""
        await asyncio.gather(*(self.connection() for _ in self._conns))

    async def request(self, payload: bytes, kind: int, count: int) -> object:
        """Send one pipelined operation and await its replies."""
        conn = await self.connection()
        return await conn.request(payload, kind, count)

    def close(self) -> None:
        """Close every connection."""
        for i, conn in enumerate(self._conns):
            if conn is not None:
                conn.close()
                self._conns[i] = None


# -- DNS SRV -----------------------------------------------------------------------------


def _nameservers(path: str = "/etc/resolv.conf") -> list[str]:
    servers = []
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                servers.append(parts[1])
    return servers or ["127.0.0.1"]


def _dns_query(name: str, qtype: int) -> tuple[int, bytes]:
    ident = random.randrange(1 << 16)
    qname = b"".join(
        bytes([len(label)]) + label for label in name.rstrip(".").encode("idna").split(b".")
    )
    return ident, struct.pack(">HHHHHH", ident, 0x0100, 1, 0, 0, 0) + qname + b"\0" + struct.pack(
        ">HH", qtype, 1
    )


def _dns_name(msg: bytes, pos: int) -> tuple[str, int]:
    """A possibly compressed name at `pos`; (name with trailing dot, position after it)."""
    labels: list[str] = []
    end = -1
    for _ in range(128):  # bounds a pointer loop
        length = msg[pos]
        if length == 0:
            pos += 1
            break
        if length & 0xC0 == 0xC0:
            if end < 0:
                end = pos + 2
            pos = ((length & 0x3F) << 8) | msg[pos + 1]
            continue
        labels.append(msg[pos + 1 : pos + 1 + length].decode("ascii", "replace"))
        pos += 1 + length
    else:
        raise ValueError("DNS name compression loop")
    return ".".join(labels) + ".", end if end >= 0 else pos


def parse_srv_response(msg: bytes, ident: int) -> list[tuple[str, int]]:
    """(target with trailing dot, port) of every SRV answer in a DNS response."""
    rid, flags, qd, an, _, _ = struct.unpack_from(">HHHHHH", msg)
    if rid != ident:
        raise ValueError("DNS response id mismatch")
    rcode = flags & 0xF
    if rcode not in (0, 3):
        raise ValueError(f"DNS error rcode {rcode}")
    pos = 12
    for _ in range(qd):
        _, pos = _dns_name(msg, pos)
        pos += 4
    out = []
    for _ in range(an):
        _, pos = _dns_name(msg, pos)
        rtype, _cls, _ttl, rdlen = struct.unpack_from(">HHIH", msg, pos)
        pos += 10
        if rtype == 33:
            _prio, _weight, port = struct.unpack_from(">HHH", msg, pos)
            target, _ = _dns_name(msg, pos + 6)
            out.append((target, port))
        pos += rdlen
    return out


class _DnsUdp(asyncio.DatagramProtocol):
    def __init__(self, future: asyncio.Future[bytes]) -> None:
        self.future = future

    def datagram_received(self, data: bytes, addr: object) -> None:
        if not self.future.done():
            self.future.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


async def lookup_srv(
    name: str, nameserver: tuple[str, int] | None = None, timeout: float = 2.0
) -> list[tuple[str, int]]:
    """SRV records of `name` from one DNS server (default: resolv.conf's first), UDP then TCP."""
    if nameserver is None:
        nameserver = (_nameservers()[0], 53)
    loop = asyncio.get_running_loop()
    ident, query = _dns_query(name, 33)
    future: asyncio.Future[bytes] = loop.create_future()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: _DnsUdp(future), remote_addr=nameserver
    )
    try:
        transport.sendto(query)
        async with asyncio.timeout(timeout):
            msg = await future
    finally:
        transport.close()
    if struct.unpack_from(">H", msg, 2)[0] & 0x0200:  # truncated: ask again over TCP
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(*nameserver)
            try:
                writer.write(struct.pack(">H", len(query)) + query)
                (size,) = struct.unpack(">H", await reader.readexactly(2))
                msg = await reader.readexactly(size)
            finally:
                writer.close()
    return parse_srv_response(msg, ident)


async def servers_from_srv(srv: str, nameserver: tuple[str, int] | None = None) -> list[str]:
    """The reference's ServerStringsFromSrv: `target:port` of every record, sorted."""
    if not _SRV_NAME.match(srv):
        raise BackendError(f"Invalid SRV string: {srv}")
    try:
        records = await lookup_srv(srv, nameserver)
    except (OSError, TimeoutError, ValueError, struct.error, IndexError) as exc:
        raise BackendError(f"Unable to fetch servers from SRV {srv}: {exc!r}") from exc
    if not records:
        raise BackendError(f"Unable to fetch servers from SRV {srv}: no records")
    return sorted(f"{target}:{port}" for target, port in records)


# -- the backend ---------------------------------------------------------------------------


async def _settle(calls: list[Coroutine[object, object, object]]) -> list[object]:
    """gather(return_exceptions=True), without tasks for the usual single node."""
    if len(calls) == 1:
        try:
            return [await calls[0]]
        except Exception as exc:
            return [exc]
    return await asyncio.gather(*calls, return_exceptions=True)


class _Partial(BackendError):
    """A multi-get error that still carries the values of the nodes that answered."""

    def __init__(self, message: str, partial: dict[bytes, bytes]) -> None:
        super().__init__(message)
        self.partial = partial


class MemcacheBackend:
    """Fixed-window counters in memcached: read to decide, increment in the background."""

    name = "memcache"
    # Its counters are read, decided on, then incremented asynchronously (the reference's
    # design): a sliding window or token bucket could not be exact, so configs using them
    # are refused at load.
    algorithms = ONLY_FIXED_WINDOW

    def __init__(
        self,
        servers: Sequence[str] = (),
        *,
        srv: str = "",
        srv_refresh: float = 0.0,
        srv_nameserver: tuple[str, int] | None = None,
        max_idle_conns: int = 2,
        ssl_context: ssl.SSLContext | None = None,
        jitter_max_seconds: int = 0,
        timeout: float = DEFAULT_TIMEOUT,
        health: Health | None = None,
        stats: StatsStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if bool(servers) == bool(srv):
            raise BackendError("memcache: set exactly one of MEMCACHE_HOST_PORT, MEMCACHE_SRV")
        self.srv = srv
        self.srv_refresh = srv_refresh
        self.srv_nameserver = srv_nameserver
        self.max_idle_conns = max_idle_conns
        self.ssl_context = ssl_context
        self.jitter = jitter_max_seconds
        self.timeout = timeout
        self.health = health
        self.clock = clock
        self.stats = MemcacheStats()
        self.nodes: list[_Node] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._queued: list[Op] = []
        self._refresher: asyncio.Task[None] | None = None
        if servers:
            self._set_servers(list(servers))
        if health is not None and "backend" not in health.components():
            health.register("backend", False)
        if stats is not None:
            self.stats.register(stats)

    @property
    def servers(self) -> list[str]:
        """The node addresses, in selector order."""
        return [n.address for n in self.nodes]

    def _set_servers(self, servers: list[str]) -> None:
        old = {n.address: n for n in self.nodes}
        nodes = []
        for address in servers:
            node = old.pop(address, None)
            if node is None:
                node = _Node(address, self.max_idle_conns, self.ssl_context, self.timeout)
            nodes.append(node)
        self.nodes = nodes
        for node in old.values():
            node.close()

    async def connect(self) -> None:
        """Resolve the nodes, dial each (unreachable ones are logged), report healthy."""
        if self.srv:
            self._set_servers(await servers_from_srv(self.srv, self.srv_nameserver))
            log.info("memcache servers from SRV %s: %s", self.srv, ", ".join(self.servers))
            if self.srv_refresh > 0:
                self._refresher = asyncio.create_task(self._refresh_loop())
        for node, result in zip(
            self.nodes,
            await asyncio.gather(*(n.warm() for n in self.nodes), return_exceptions=True),
            strict=True,
        ):
            if isinstance(result, BaseException):
                log.warning("memcache %s not reachable at startup: %s", node.address, result)
        if self.health is not None:
            self.health.set("backend", True)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.srv_refresh)
            try:
                servers = await servers_from_srv(self.srv, self.srv_nameserver)
            except BackendError as exc:
                log.error("memcache SRV refresh failed, keeping %s: %s", self.servers, exc)
                continue
            if servers != self.servers:
                log.info("memcache servers from SRV %s: %s", self.srv, ", ".join(servers))
                self._set_servers(servers)

    async def _multiget(self, keys: Sequence[str]) -> dict[bytes, bytes]:
        """gomemcache GetMulti: one `get` per node, all at once; raise on any error."""
        encoded = [k.encode() for k in keys]
        self.stats.inc("keys_requested", len(encoded))
        for k in encoded:
            if not legal_key(k):
                self.stats.inc("multiget.__code=error")
                raise BackendError(f"memcache: malformed key {k[:300]!r}")
        nodes = self.nodes
        if not nodes:
            self.stats.inc("multiget.__code=error")
            raise BackendError("memcache: no servers configured or available")
        if len(nodes) == 1:
            groups = {0: encoded}
        else:
            groups = {}
            for k in encoded:
                groups.setdefault(pick_node(k, len(nodes)), []).append(k)
        found: dict[bytes, bytes] = {}
        error: BaseException | None = None
        results = await _settle(
            [
                nodes[i].request(b"get " + b" ".join(dict.fromkeys(ks)) + b"\r\n", _GET, 1)
                for i, ks in groups.items()
            ]
        )
        for result in results:
            if isinstance(result, BaseException):
                error = result
            else:
                found.update(result)  # type: ignore[call-overload]
        if error is not None:
            self.stats.inc("multiget.__code=error")
            raise _Partial(str(error), found) from error
        self.stats.inc("keys_found", len(found))
        self.stats.inc("multiget.__code=success")
        return found

    async def _values(self, keys: Sequence[str]) -> list[int]:
        """Current counters; 0 for missing, unparsable or unreachable (fails open)."""
        try:
            found = await self._multiget(keys)
        except BackendError as exc:
            log.error("Error multi-getting memcache keys (%s): %s", list(keys), exc)
            found = exc.partial if isinstance(exc, _Partial) else {}
        out = []
        for key in keys:
            raw = found.get(key.encode())
            value = 0
            if raw is not None:
                parsed = parse_int32(raw)
                if parsed is None:
                    log.error("Unexpected non-numeric value in memcached: %r", raw)
                else:
                    value = parsed & 0xFFFFFFFF  # the reference stores it in a uint32
            out.append(value)
        return out

    async def increment(self, ops: Sequence[Op]) -> list[int]:
        """Counters as the decision sees them (value + hits); the increments follow unawaited."""
        if not ops:
            return []
        values = await self._values([op.key for op in ops])
        # The increments of every request of this loop iteration go out as one batch.
        if not self._queued:
            asyncio.get_running_loop().call_soon(self._start_batch)
        self._queued.extend(ops)
        return [v + op.hits for v, op in zip(values, ops, strict=True)]

    async def get(self, ops: Sequence[Op]) -> list[int]:
        """Current values (0 when absent; fails open like `increment`)."""
        if not ops:
            return []
        return await self._values([op.key for op in ops])

    def _start_batch(self) -> None:
        ops = self._queued
        self._queued = []
        if ops:
            task = asyncio.get_running_loop().create_task(self._increment_all(ops))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def flush(self) -> None:
        """Wait for every background increment scheduled so far (the reference's Flush)."""
        while self._queued or self._tasks:
            if self._queued:
                await asyncio.sleep(0)  # let `_start_batch` run
            else:
                await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        """Wait (bounded) for pending increments, then close every connection."""
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None
        if self._tasks or self._queued:
            try:
                async with asyncio.timeout(CLOSE_GRACE):
                    await self.flush()
            except TimeoutError:
                log.warning("memcache: %d increment batches dropped at close", len(self._tasks))
                for task in list(self._tasks):
                    task.cancel()
        for node in self.nodes:
            node.close()

    # -- background increments ------------------------------------------------------------

    def _expiry(self, seconds: int) -> int:
        ttl = seconds + (random.randrange(self.jitter) if self.jitter > 0 else 0)
        if ttl > _RELATIVE_EXPIRY_MAX:
            return int(self.clock()) + ttl
        return ttl

    async def _increment_all(self, ops: Sequence[Op]) -> None:
        """incr; on NOT_FOUND add; on NOT_STORED incr again. Errors are logged and counted."""
        items = []
        for op in ops:
            k = op.key.encode()
            if legal_key(k):
                items.append((k, op.hits, op.seconds))
            else:
                log.error("Failed to increment key %r: malformed key", op.key)
                self.stats.inc("increment.__code=error")
        if not items:
            return
        replies = await self._batch([(k, b"incr %s %d\r\n" % (k, h)) for k, h, _ in items])
        missed = []
        for (k, h, seconds), reply in zip(items, replies, strict=True):
            if reply == b"NOT_FOUND":
                self.stats.inc("increment.__code=miss")
                missed.append((k, h, seconds))
            elif reply is not None and reply.isdigit():
                self.stats.inc("increment.__code=success")
            else:
                self.stats.inc("increment.__code=error")
                log.error("Failed to increment key %r: %r", k, reply)
        if not missed:
            return
        adds = []
        for k, h, seconds in missed:
            data = b"%d" % h
            adds.append(
                (k, b"add %s 0 %d %d\r\n%s\r\n" % (k, self._expiry(seconds), len(data), data))
            )
        replies = await self._batch(adds)
        raced = []
        for (k, h, _seconds), reply in zip(missed, replies, strict=True):
            if reply == b"STORED":
                self.stats.inc("add.__code=success")
            elif reply == b"NOT_STORED":
                self.stats.inc("add.__code=not_stored")
                raced.append((k, h))
            else:
                self.stats.inc("add.__code=error")
                log.error("Failed to add key %r: %r", k, reply)
        if not raced:
            return
        replies = await self._batch([(k, b"incr %s %d\r\n" % (k, h)) for k, h in raced])
        for (k, _h), reply in zip(raced, replies, strict=True):
            if reply is not None and reply.isdigit():
                self.stats.inc("increment.__code=success")
            else:
                # NOT_FOUND here too: the key expired between the add and this incr.
                self.stats.inc(
                    "increment.__code=miss" if reply == b"NOT_FOUND" else "increment.__code=error"
                )
                log.error("Failed to increment key %r after failing to add: %r", k, reply)

    async def _batch(self, commands: list[tuple[bytes, bytes]]) -> list[bytes | None]:
        """One pipelined write per node; each command's reply line (None: node error)."""
        nodes = self.nodes
        out: list[bytes | None] = [None] * len(commands)
        if not nodes:
            return out
        groups: dict[int, list[int]] = {}
        for j, (k, _cmd) in enumerate(commands):
            groups.setdefault(pick_node(k, len(nodes)), []).append(j)
        node_ids = list(groups)
        results = await _settle(
            [
                nodes[i].request(
                    b"".join(commands[j][1] for j in groups[i]), _LINES, len(groups[i])
                )
                for i in node_ids
            ]
        )
        for i, result in zip(node_ids, results, strict=True):
            if isinstance(result, BaseException):
                log.error("memcache %s: %s", nodes[i].address, result)
                continue
            for j, line in zip(groups[i], result, strict=True):  # type: ignore[call-overload]
                out[j] = line
        return out


def ssl_context_from(settings: MemcacheSettings) -> ssl.SSLContext | None:
    """MEMCACHE_TLS with its CA, client certificate and hostname-verification settings."""
    if not settings.tls:
        return None
    ctx = ssl.create_default_context(cafile=settings.tls_cacert or None)
    if settings.tls_client_cert:
        ctx.load_cert_chain(settings.tls_client_cert, settings.tls_client_key or None)
    if settings.tls_skip_hostname_verification:
        # As the Redis backend: the chain is still verified, only the name is not.
        ctx.check_hostname = False
    return ctx


def create_memcache_backend(
    settings: Settings, health: Health | None = None, stats: StatsStore | None = None
) -> MemcacheBackend:
    """The registry factory: a MemcacheBackend from Settings (await `connect()` before serving)."""
    memcache = settings.memcache
    return MemcacheBackend(
        memcache.host_port,
        srv=memcache.srv,
        srv_refresh=memcache.srv_refresh,
        max_idle_conns=memcache.max_idle_conns,
        ssl_context=ssl_context_from(memcache),
        jitter_max_seconds=settings.cache.expiration_jitter_max_seconds,
        health=health,
        stats=stats,
    )
