"""The memcached backend: decide on one multi-get, count in the background.

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
`decrement.__code=success|miss|error` (refunds, upstream #1140),
`add.__code=success|error|not_stored`, `keys_requested`, `keys_found`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import ssl
import time
import zlib
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING

from ...runtime.aio import cancel
from .. import MEMCACHE
from ..base import BackendError, Op, client_ssl_context
from .protocol import GET, LINES, Node
from .srv import lookup_srv, parse_srv_response, servers_from_srv

if TYPE_CHECKING:
    from ...health import Health
    from ...settings import MemcacheSettings, Settings
    from ...stats import StatsStore

__all__ = [
    "MemcacheBackend",
    "MemcacheStats",
    "create_memcache_backend",
    "legal_key",
    "lookup_srv",
    "parse_counter",
    "parse_int32",
    "parse_srv_response",
    "pick_node",
    "servers_from_srv",
    "ssl_context_from",
]

log = logging.getLogger("ratelimitd.backends.memcache")

DEFAULT_TIMEOUT = 0.5  # gomemcache DefaultTimeout: dial and each operation
CLOSE_GRACE = 2.0  # close() waits this long for background increments
MAX_KEY_LENGTH = 250
_RELATIVE_EXPIRY_MAX = 30 * 24 * 3600  # above this memcached reads an absolute time
_INT32_MAX = 2**31 - 1
# Bytes gomemcache's legalKey refuses: controls, space and DEL.
_ILLEGAL_KEY_BYTES = re.compile(rb"[\x00-\x20\x7f]")

_STAT_NAMES = (
    "multiget.__code=success",
    "multiget.__code=error",
    "increment.__code=success",
    "increment.__code=miss",
    "increment.__code=error",
    "decrement.__code=success",
    "decrement.__code=miss",
    "decrement.__code=error",
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


def parse_counter(raw: bytes) -> int | None:
    """A stored counter as the decision sees it: Go's ParseInt(s, 10, 32) into a uint32, as
    the reference reads it, except that a number past the int32 range saturates at 2^32-1
    where the reference reads 0 (a key made unlimited by one huge hits_addend). None when it
    is not a number at all (the reference's logged error).

    Trailing spaces are not part of the number: a `decr` that shortens a counter may leave
    it space-padded in place ("10" less 3 is stored as "7 ", as memcached's protocol.txt
    allows), which ParseInt refuses, so the reference reads a refunded counter as 0.
    """
    raw = raw.rstrip(b" ")
    value = parse_int32(raw)
    if value is not None:
        return value & 0xFFFFFFFF
    if raw.isdigit():
        return 0xFFFFFFFF
    return None


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
    # design): a sliding window or token bucket could not be exact, so it declares the fixed
    # window only and configs using them are refused at load.
    capabilities = MEMCACHE

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
        self.nodes: list[Node] = []
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
                node = Node(address, self.max_idle_conns, self.ssl_context, self.timeout)
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
                nodes[i].request(b"get " + b" ".join(dict.fromkeys(ks)) + b"\r\n", GET, 1)
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
                parsed = parse_counter(raw)
                if parsed is None:
                    log.error("Unexpected non-numeric value in memcached: %r", raw)
                else:
                    value = parsed
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
        return _as_decided(values, ops)

    async def peek(self, ops: Sequence[Op]) -> list[int]:
        """What `increment` returns (it decides on the values read): nothing queued."""
        return _as_decided(await self._values([op.key for op in ops]), ops) if ops else []

    async def get(self, ops: Sequence[Op]) -> list[int]:
        """Current values (0 when absent; fails open like `increment`)."""
        if not ops:
            return []
        return await self._values([op.key for op in ops])

    async def delete(self, keys: Sequence[str]) -> int:
        """`delete` per key (after the increments already queued); how many existed."""
        await self.flush()
        commands = [(k.encode(), b"delete " + k.encode() + b"\r\n") for k in keys]
        replies = await self._batch(commands)
        if any(reply is None for reply in replies):
            raise BackendError("memcache: a node did not answer the delete")
        return sum(reply == b"DELETED" for reply in replies)

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
        await cancel(self._refresher)
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
        """incr; on NOT_FOUND add; on NOT_STORED incr again. Errors are logged and counted.

        A refund is a `decr` (memcached floors it at 0; a missing key stays missing)."""
        items = []
        refunds: list[tuple[bytes, bytes]] = []
        for op in ops:
            k = op.key.encode()
            if not legal_key(k):
                log.error("Failed to increment key %r: malformed key", op.key)
                self.stats.inc("decrement.__code=error" if op.refund else "increment.__code=error")
            elif op.refund:
                refunds.append((k, b"decr %s %d\r\n" % (k, op.hits)))
            else:
                items.append((k, op.hits, op.seconds))
        if refunds:
            await self._decrement_all(refunds)
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

    async def _decrement_all(self, commands: list[tuple[bytes, bytes]]) -> None:
        """The refunds' `decr`s, counted as the reference's decrement stats."""
        for (k, _cmd), reply in zip(commands, await self._batch(commands), strict=True):
            if reply == b"NOT_FOUND":
                self.stats.inc("decrement.__code=miss")
            elif reply is not None and reply.isdigit():
                self.stats.inc("decrement.__code=success")
            else:
                self.stats.inc("decrement.__code=error")
                log.error("Failed to decrement key %r: %r", k, reply)

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
                nodes[i].request(b"".join(commands[j][1] for j in groups[i]), LINES, len(groups[i]))
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


def _as_decided(values: Sequence[int], ops: Sequence[Op]) -> list[int]:
    """The counters a decision sees: value + hits; a refund decides on the value it will
    leave (floored at 0, as memcached's decr)."""
    return [
        max(0, v - op.hits) if op.refund else v + op.hits for v, op in zip(values, ops, strict=True)
    ]


def ssl_context_from(settings: MemcacheSettings) -> ssl.SSLContext | None:
    """MEMCACHE_TLS with its CA, client certificate and hostname-verification settings."""
    return client_ssl_context(settings, "MEMCACHE_") if settings.tls else None


def create_memcache_backend(
    settings: Settings, health: Health | None = None, stats: StatsStore | None = None, *_: object
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
