"""The Redis backend: fixed-window counters as INCRBY + EXPIRE, auto-pipelined.

Per request (reference section 8.1) every key gets `INCRBY key hits` then `EXPIRE key
unit + rand[0, EXPIRATION_JITTER_MAX_SECONDS)`, one pipeline for the main instance and,
with REDIS_PERSECOND, one for the per-second instance (SECOND keys), awaited main first.
No MULTI and no Lua, as the reference.

Hot path. Commands are RESP-encoded by `resp` into one bytes object per request and
handed to a `_Pool`. The pool buffers the payloads of every request of one event-loop
iteration and writes them with a single `transport.write` on one connection (a flush):
`loop.call_soon` with REDIS_PIPELINE_WINDOW = 0, `loop.call_later(window)` otherwise,
and at once when REDIS_PIPELINE_LIMIT commands are buffered. Flushes, not requests, are
spread round-robin over the REDIS_POOL_SIZE connections: a request's commands stay on
one connection in order, and under load one write carries many decisions (fewer round
trips and syscalls than one connection per request would give).

Timeouts. A request never waits longer than REDIS_REQUEST_TIMEOUT (default 50 ms) for
one round of replies (a request has one round, two with STOP_CACHE_KEY_INCREMENT_WHEN_
OVERLIMIT or with keys on both instances), even when Redis hangs. Why 50 ms: Envoy's
rate-limit filter gives up after 20 ms by default (then `failure_mode_deny` decides), so
a later answer is wasted on a default Envoy; but a timeout here is not free, because
replies are positional and the connection must be closed and replaced, so it must not
fire on ordinary jitter (a GC pause, a loaded loopback, a slow fork for BGSAVE). 50 ms
is Envoy's budget plus that margin and covers fleets that raise Envoy's timeout; behind
a hung Redis it bounds the pile-up to 50 ms of traffic. Operators of default Envoys may
set 20ms. When it expires the connection is presumed hung: its pending requests fail, it
is closed and replaced in the background. Each connection also bounds its in-flight
commands (`max_in_flight`, and no flush is larger); beyond it, and while no connection
is up, requests fail at once with BackendError. Reconnection runs in a background task
with capped exponential backoff and jitter; no request ever waits on it.

Topologies: single (tcp `host:port`, unix path, `redis://`, `rediss://`, `unix://`
URLs), sentinel (`master,host:port,...`; the master is asked of the sentinels on every
(re)connect, and a READONLY reply or a lost connection triggers the rediscovery;
sentinels are dialled with the instance's TLS settings and REDIS_SENTINEL_AUTH), and
cluster (`host:port,...`; slot map from CLUSTER SLOTS, CRC16 slots with `{hashtag}`,
a request's commands grouped per node into one pipeline each, all nodes' pipelines in
flight at once, MOVED and ASK followed, the map refreshed in the background on MOVED).
With auto-pipelining the per-node groups cost no extra connections, so they are always
sent together, as REDIS_CLUSTER_PIPELINE_PARALLELISM=0 asks (settings accepts 0 and the
default 1, and refuses larger values).
A READONLY reply from a single server (a demoted master behind a re-pointed address) or
a sentinel's master drops the pool's connections, which re-dial: what the reference's
REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR=true asks, always on.

Passwords never reach a log line or an error message: addresses are shown through
`RedisSettings.masked_url`.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import logging
import random
import ssl
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..settings import RedisSettings, redis_auth
from . import resp, scripts
from .base import FIXED_WINDOW, SLIDING_WINDOW, TOKEN_BUCKET, BackendError, Op
from .resp import Batch, ReplyError, RespConnection, SharedFuture

if TYPE_CHECKING:
    from ..health import Health
    from ..settings import Settings
    from ..stats import StatsStore

log = logging.getLogger(__name__)

Address = tuple[str, int] | str  # (host, port) or a unix socket path

_RECONNECT_INITIAL = 0.05
_RECONNECT_MAX = 1.0
_MAX_REDIRECTS = 5
_SLOTS = 16384
# Commands one connection may have in flight; a flush is never larger.
MAX_IN_FLIGHT = 8192


def go_duration(seconds: float) -> str:
    """A duration as Go's time.Duration.String prints it (`500ms`, `5s`, `1m30s`)."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        ms = seconds * 1000
        return f"{ms:g}ms" if ms >= 1 else f"{seconds * 1e6:g}µs"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.9f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes:
        return f"{int(minutes)}m{text}"
    return text


def key_slot(key: bytes) -> int:
    """The Redis Cluster hash slot of a key: CRC16/XMODEM of the key or its {hashtag}."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return binascii.crc_hqx(key, 0) & (_SLOTS - 1)


def _host_port(item: str) -> tuple[str, int]:
    host, sep, port = item.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise BackendError(f"invalid redis address {item!r} (expected host:port)")
    return host.strip("[]"), int(port)


def _ssl_context(s: RedisSettings) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=s.tls_cacert or None)
    if s.tls_client_cert:
        ctx.load_cert_chain(s.tls_client_cert, s.tls_client_key or None)
    if s.tls_skip_hostname_verification:
        # As the reference: the chain is still verified, only the name is not.
        ctx.check_hostname = False
    return ctx


class _Counters:
    """Connection statistics of one instance (ratelimit.<label>.*)."""

    __slots__ = ("active", "local_close", "on_change", "total")

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.active = 0
        self.total = 0
        self.local_close = 0
        self.on_change = on_change


class _Dialer:
    """How to open a connection of one instance to one address."""

    def __init__(self, s: RedisSettings, ssl_context: ssl.SSLContext | None) -> None:
        self.s = s
        self.ssl_context = ssl_context
        self.username, self.password = redis_auth(s.auth)

    def with_url_credentials(self, username: str | None, password: str | None) -> None:
        """Credentials from a redis:// URL, unless REDIS_AUTH set them."""
        if self.password is None and password:
            self.username, self.password = username or None, password

    async def open(
        self,
        address: Address,
        on_lost: Callable[[RespConnection], None] | None = None,
        *,
        auth: tuple[str | None, str | None] | None = None,
    ) -> RespConnection:
        """A ready connection (AUTH + PING done); `auth` overrides the instance's."""
        username, password = auth if auth is not None else (self.username, self.password)
        return await resp.open_connection(
            address,
            timeout=self.s.request_timeout,
            dial_timeout=self.s.dial_timeout,
            ssl_context=self.ssl_context,
            username=username,
            password=password,
            on_lost=on_lost,
        )

    async def query(self, address: Address, *args: str | int, **kw: Any) -> Any:
        """One control-plane command on a short-lived connection; its reply."""
        conn = await self.open(address, **kw)
        try:
            (reply,) = await conn.call(resp.command(*args), 1, self.s.dial_timeout)
        finally:
            conn.close()
            await conn.wait_closed()
        if isinstance(reply, ReplyError):
            raise BackendError(str(reply))
        return reply


class _Pool:
    """REDIS_POOL_SIZE connections to one server, fed by per-iteration flushes."""

    def __init__(
        self,
        s: RedisSettings,
        dialer: _Dialer,
        resolve: Callable[[], Awaitable[Address]],
        counters: _Counters,
        describe: str,
        max_in_flight: int,
    ) -> None:
        self.s = s
        self.max_in_flight = max_in_flight
        self.dialer = dialer
        self.resolve = resolve
        self.counters = counters
        self.describe = describe
        self.loop: asyncio.AbstractEventLoop | None = None  # bound when first opened
        self.conns: list[RespConnection] = []
        self.writes = 0  # flushes: one transport.write each
        self.closed = False
        self._buf: list[bytes] = []
        self._fut: SharedFuture | None = None  # the replies of the flush being built
        self._cmds = 0
        self._scheduled = False
        self._rr = 0
        self._maintainer: asyncio.Task[None] | None = None
        self._window = s.pipeline_window
        # Commands per flush: REDIS_PIPELINE_LIMIT, and never more than one connection
        # may have in flight, so a burst is split over connections instead of refused.
        self._limit = min(s.pipeline_limit or max_in_flight, max_in_flight)

    # hot path ---------------------------------------------------------------------

    def submit(self, payload: bytes, n: int) -> tuple[SharedFuture, int]:
        """Queue one request's commands for the next flush.

        Returns the flush's future (its result: every reply of the flush, or a
        BackendError) and the offset of this request's first reply in it. One future
        per flush rather than per request keeps dispatch off the per-request path.
        """
        if not self.conns:
            raise BackendError(f"no connection to redis at {self.describe}")
        offset = self._cmds
        if offset and offset + n > self._limit:
            self._flush()
            offset = 0
        fut = self._fut
        if fut is None:
            fut = self._fut = SharedFuture(loop=self.loop)
        self._buf.append(payload)
        self._cmds = offset + n
        if self._cmds >= self._limit:
            self._flush()
        elif not self._scheduled:
            self._scheduled = True
            loop = self.loop
            assert loop is not None  # a connection exists, so the pool was opened
            if self._window:
                loop.call_later(self._window, self._scheduled_flush)
            else:
                loop.call_soon(self._scheduled_flush)
        return fut, offset

    def _scheduled_flush(self) -> None:
        self._scheduled = False
        if self._fut is not None:
            self._flush()

    def _flush(self) -> None:
        fut = self._fut
        assert fut is not None
        cmds = self._cmds
        payload = b"".join(self._buf)
        self._buf = []
        self._fut = None
        self._cmds = 0
        conns = self.conns
        limit = self.max_in_flight
        for _ in range(len(conns)):
            self._rr += 1
            conn = conns[self._rr % len(conns)]
            if conn.in_flight + cmds <= limit:
                self.writes += 1
                conn.write(payload, [Batch(fut, cmds)], cmds)
                return
        reason = "redis pipeline full" if conns else "no connection to redis"
        fut.set_result(BackendError(f"{reason} at {self.describe}"))

    # connections ------------------------------------------------------------------

    async def open_all(self) -> None:
        """Open the missing connections concurrently; raise if none is up afterwards."""
        address = await self.resolve()
        missing = self.s.pool_size - len(self.conns)
        results = await asyncio.gather(
            *(self._open(address) for _ in range(missing)), return_exceptions=True
        )
        if not self.conns:
            errors = [r for r in results if isinstance(r, BaseException)]
            raise errors[0] if errors else BackendError("no connection")
        if len(self.conns) < self.s.pool_size:
            self.maintain()

    async def _open(self, address: Address) -> None:
        self.loop = asyncio.get_running_loop()
        conn = await self.dialer.open(address, self._lost)
        if self.closed:
            conn.close()
            return
        if conn.closed:  # lost before we could adopt it
            return
        self.conns.append(conn)
        counters = self.counters
        counters.total += 1
        counters.active += 1
        counters.on_change()

    def _lost(self, conn: RespConnection) -> None:
        if conn in self.conns:
            self.conns.remove(conn)
            counters = self.counters
            counters.active -= 1
            if conn.local_close:
                counters.local_close += 1
            counters.on_change()
            if not self.conns and not self.closed:
                log.warning("no connection left to redis at %s; reconnecting", self.describe)
        if not self.closed:
            self.maintain()

    def maintain(self) -> None:
        """Refill the pool in the background (no request ever waits for it)."""
        if self._maintainer is None and not self.closed:
            self._maintainer = asyncio.get_running_loop().create_task(self._maintain())

    async def _maintain(self) -> None:
        delay = _RECONNECT_INITIAL
        try:
            while not self.closed and len(self.conns) < self.s.pool_size:
                try:
                    address = await self.resolve()
                    while not self.closed and len(self.conns) < self.s.pool_size:
                        await self._open(address)
                    delay = _RECONNECT_INITIAL
                except BackendError as exc:
                    log.debug("reconnecting to redis at %s: %s", self.describe, exc)
                    await asyncio.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, _RECONNECT_MAX)
        finally:
            self._maintainer = None

    def reset(self) -> None:
        """Drop every connection (the master moved); the maintainer reconnects."""
        for conn in list(self.conns):
            conn.abort("redis master changed")

    async def close(self) -> None:
        """Close every connection and stop reconnecting."""
        self.closed = True
        if self._maintainer is not None:
            self._maintainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintainer
        conns = list(self.conns)
        for conn in conns:
            conn.close()
        for conn in conns:
            await conn.wait_closed()


async def _replies(submitted: tuple[SharedFuture, int], n: int) -> list[Any]:
    """Await a submitted request: its `n` replies, or raise the BackendError of its flush."""
    fut, offset = submitted
    replies = await fut
    if replies.__class__ is not list:
        raise BackendError(*replies.args)  # a fresh instance per request
    return replies[offset : offset + n]  # type: ignore[no-any-return]


class RedisInstance:
    """One Redis deployment (single, sentinel or cluster) with its pool(s)."""

    def __init__(
        self,
        s: RedisSettings,
        jitter_max_seconds: int,
        on_change: Callable[[], None],
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.s = s
        self.jitter = jitter_max_seconds
        self.max_in_flight = max_in_flight
        self.counters = _Counters(on_change)
        self.dialer = _Dialer(s, _ssl_context(s) if s.tls else None)

    @property
    def writes(self) -> int:
        """Flushes (transport writes of pipelined requests) so far."""
        return sum(p.writes for p in self.pools())

    def pools(self) -> list[_Pool]:
        """Every connection pool of this instance."""
        raise NotImplementedError

    async def open(self) -> None:
        """One connection attempt for the startup loop."""
        raise NotImplementedError

    async def incr_expire(self, ops: Sequence[Op]) -> list[int]:
        """INCRBY + EXPIRE per op; the counters."""
        raise NotImplementedError

    async def get(self, keys: Sequence[str]) -> list[int]:
        """GET per key (0 when absent)."""
        raise NotImplementedError

    async def _run(self, cmds: list[tuple[int, bytes]]) -> list[Any]:
        """One reply per (slot, command), all sent in one round (per node)."""
        raise NotImplementedError

    async def decide(self, ops: Sequence[Op], *, peek: bool = False) -> list[Any]:
        """Ops of any algorithm in one round: INCRBY + EXPIRE (GET with `peek`) for a fixed
        window, the script's call for the others (`(level, ticks until reset)`, the level
        alone with `peek`)."""
        cluster = isinstance(self, ClusterInstance)
        cmds: list[tuple[int, bytes]] = []
        owner: list[int] = []  # the op of each command
        for j, op in enumerate(ops):
            k = op.key.encode()
            slot = key_slot(k) if cluster else 0
            if op.algorithm:
                cmds.append((slot, scripts.call(op, k, peek=peek)))
                owner.append(j)
            elif peek:
                cmds.append((slot, resp.get(k)))
                owner.append(j)
            else:
                cmds.append((slot, resp.incrby(k, op.hits)))
                cmds.append((slot, resp.expire(k, self._jittered(op.seconds))))
                owner += (j, j)
        replies = await self._run(cmds)
        missing = [i for i, reply in enumerate(replies) if scripts.is_noscript(reply)]
        if missing:  # the server lost its scripts: EVAL loads them again
            again = [
                (
                    cmds[i][0],
                    scripts.call(ops[owner[i]], ops[owner[i]].key.encode(), peek=peek, load=True),
                )
                for i in missing
            ]
            for i, reply in zip(missing, await self._run(again), strict=True):
                replies[i] = reply
        out: list[Any] = []
        i = 0
        for op in ops:
            reply = replies[i]
            if op.algorithm:
                if reply.__class__ is not list:
                    self._fail(reply)
                out.append(reply[0] if peek else (reply[0], reply[1]))
                i += 1
            elif peek:
                if reply is None:
                    out.append(0)
                elif reply.__class__ is bytes:
                    out.append(int(reply))
                else:
                    self._fail(reply)
                i += 1
            else:
                if reply.__class__ is not int:
                    self._fail(reply)
                if replies[i + 1].__class__ is not int:
                    self._fail(replies[i + 1])
                out.append(reply)
                i += 2
        return out

    def _fail(self, reply: Any) -> None:
        self._raise_reply(reply)

    async def start(self) -> None:
        """Connect + PING with the REDIS_STARTUP_* backoff, as the reference's startup."""
        s = self.s
        log.warning("connecting to redis on %s with pool size %d", s.masked_url, s.pool_size)
        started = time.monotonic()
        interval = s.startup_initial_interval
        while True:
            try:
                await self.open()
                return
            except BackendError as exc:
                elapsed = time.monotonic() - started
                limit = s.startup_max_elapsed_time
                wait = interval * (0.5 + random.random())
                if limit and elapsed + wait > limit:
                    raise BackendError(
                        f"timed out waiting for Redis connection to {s.masked_url} after "
                        f"{go_duration(limit)}: {exc}"
                    ) from exc
                log.warning("redis on %s not ready: %s", s.masked_url, exc)
                await asyncio.sleep(wait)
                interval = min(interval * 2, s.startup_max_interval)

    async def close(self) -> None:
        """Close every pool."""
        for pool in self.pools():
            await pool.close()

    def _jittered(self, seconds: int) -> int:
        jitter = self.jitter
        return seconds + int(random.random() * jitter) if jitter > 0 else seconds

    def _raise_reply(self, reply: Any) -> None:
        if isinstance(reply, ReplyError):
            raise BackendError(str(reply))
        raise BackendError(f"unexpected redis reply {reply!r}")


class SingleInstance(RedisInstance):
    """A single server, or the master a set of sentinels points at."""

    def __init__(
        self,
        s: RedisSettings,
        jitter_max_seconds: int,
        on_change: Callable[[], None],
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        super().__init__(s, jitter_max_seconds, on_change, max_in_flight)
        self.address: Address
        self.sentinels: list[tuple[str, int]] = []
        self.master_name = ""
        if s.type == "sentinel":
            items = [i.strip() for i in s.url.split(",")]
            self.master_name = items[0]
            self.sentinels = [_host_port(i) for i in items[1:]]
            self.address = ("", 0)
            resolve = self._ask_sentinels
            describe = f"sentinel master {self.master_name}"
        else:
            self.address = self._parse_single(s.url)
            resolve = self._static
            describe = s.masked_url
        self.pool = _Pool(s, self.dialer, resolve, self.counters, describe, max_in_flight)

    def _parse_single(self, url: str) -> Address:
        scheme, sep, _ = url.partition("://")
        if not sep:
            if self.s.socket_type == "unix":
                return url
            return _host_port(url)
        parts = urllib.parse.urlsplit(url)
        self.dialer.with_url_credentials(
            urllib.parse.unquote(parts.username) if parts.username else None,
            urllib.parse.unquote(parts.password) if parts.password else None,
        )
        if scheme == "unix":
            return parts.path
        if scheme == "rediss" and self.dialer.ssl_context is None:
            self.dialer.ssl_context = _ssl_context(self.s)
        if scheme not in ("redis", "rediss"):
            raise BackendError(f"unsupported redis URL scheme {scheme!r}")
        return (parts.hostname or "localhost", parts.port or 6379)

    async def _static(self) -> Address:
        return self.address

    async def _ask_sentinels(self) -> Address:
        """The current master address, from the first sentinel that knows it."""
        sentinel_auth = redis_auth(self.s.sentinel_auth)
        error: Exception | None = None
        for sentinel in self.sentinels:
            try:
                reply = await self.dialer.query(
                    sentinel,
                    "SENTINEL",
                    "get-master-addr-by-name",
                    self.master_name,
                    auth=sentinel_auth,
                )
            except BackendError as exc:
                error = exc
                continue
            if reply:
                address = (reply[0].decode(), int(reply[1]))
                if address != self.address:
                    log.warning("redis sentinel master %s is at %s:%d", self.master_name, *address)
                    self.address = address
                return address
        raise BackendError(
            f"no sentinel knows master {self.master_name}" + (f": {error}" if error else "")
        )

    def pools(self) -> list[_Pool]:
        """The one pool."""
        return [self.pool]

    async def open(self) -> None:
        """Open the pool (at least one connection)."""
        await self.pool.open_all()

    async def _run(self, cmds: list[tuple[int, bytes]]) -> list[Any]:
        """One pipeline."""
        n = len(cmds)
        return await _replies(self.pool.submit(b"".join(c for _, c in cmds), n), n)

    def _fail(self, reply: Any) -> None:
        self._failed(reply)

    async def incr_expire(self, ops: Sequence[Op]) -> list[Any]:
        """One pipeline: INCRBY + EXPIRE per op (`decide` when an op has an algorithm)."""
        for op in ops:
            if op.algorithm:
                if len(ops) == 1:  # the common case, without `decide`'s bookkeeping
                    fut, offset = self.pool.submit(scripts.call(op, op.key.encode()), 1)
                    replies = await fut
                    if replies.__class__ is not list:
                        raise BackendError(*replies.args)
                    reply = replies[offset]
                    if reply.__class__ is list:
                        return [(reply[0], reply[1])]
                return await self.decide(ops)
        jitter = self.jitter
        encode = resp.incrby_expire
        if len(ops) == 1:
            op = ops[0]
            seconds = op.seconds
            if jitter > 0:
                seconds += int(random.random() * jitter)
            payload = encode(op.key.encode(), op.hits, seconds)
        else:
            parts = []
            for op in ops:
                seconds = op.seconds
                if jitter > 0:
                    seconds += int(random.random() * jitter)
                parts.append(encode(op.key.encode(), op.hits, seconds))
            payload = b"".join(parts)
        n = 2 * len(ops)
        fut, offset = self.pool.submit(payload, n)
        replies = await fut
        if replies.__class__ is not list:
            raise BackendError(*replies.args)  # a fresh instance per request
        if n == 2:
            count = replies[offset]
            if count.__class__ is not int:
                self._failed(count)
            if replies[offset + 1].__class__ is not int:
                self._failed(replies[offset + 1])
            return [count]
        mine = replies[offset : offset + n]
        for reply in mine:
            if reply.__class__ is not int:
                self._failed(reply)
        return mine[::2]  # type: ignore[no-any-return]

    async def get(self, keys: Sequence[str]) -> list[int]:
        """One pipeline of GETs."""
        payload = b"".join(resp.get(k.encode()) for k in keys)
        replies = await _replies(self.pool.submit(payload, len(keys)), len(keys))
        out = []
        for reply in replies:
            if reply is None:
                out.append(0)
            elif reply.__class__ is bytes:
                out.append(int(reply))
            else:
                self._failed(reply)
        return out

    def _failed(self, reply: Any) -> None:
        if isinstance(reply, ReplyError) and str(reply).startswith("READONLY"):
            # A demoted master (sentinel failover): find the new one.
            self.pool.reset()
        self._raise_reply(reply)


class ClusterInstance(RedisInstance):
    """A Redis Cluster: a pool per master, commands routed by hash slot."""

    def __init__(
        self,
        s: RedisSettings,
        jitter_max_seconds: int,
        on_change: Callable[[], None],
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        super().__init__(s, jitter_max_seconds, on_change, max_in_flight)
        self.seeds = [_host_port(i) for i in s.url.split(",") if i.strip()]
        self.slots: list[str | None] = [None] * _SLOTS
        self.nodes: dict[str, _Pool] = {}
        self.redirects = 0  # MOVED + ASK replies followed
        self.asks = 0
        self.refreshes = 0
        self._refresher: asyncio.Task[None] | None = None

    def pools(self) -> list[_Pool]:
        """One pool per known master."""
        return list(self.nodes.values())

    async def open(self) -> None:
        """Read the slot map, then open a pool per master."""
        await self.refresh()
        errors = await asyncio.gather(
            *(p.open_all() for p in self.nodes.values() if not p.conns),
            return_exceptions=True,
        )
        for error in errors:
            if isinstance(error, BaseException):
                raise error

    async def refresh(self) -> None:
        """CLUSTER SLOTS from the first node that answers; rebuild the slot map."""
        known = [_host_port(n) for n in self.nodes] + self.seeds
        error: Exception | None = None
        for host, port in dict.fromkeys(known):
            try:
                reply = await self.dialer.query((host, port), "CLUSTER", "SLOTS")
            except BackendError as exc:
                error = exc
                continue
            slots: list[str | None] = [None] * _SLOTS
            for entry in reply:
                start, end, master = entry[0], entry[1], entry[2]
                node_host = master[0].decode() if master[0] else host
                if node_host in ("", "?"):
                    node_host = host
                node = f"{node_host}:{int(master[1])}"
                self._node(node)
                slots[start : end + 1] = [node] * (end - start + 1)
            self.slots = slots
            self.refreshes += 1
            return
        raise BackendError(f"no cluster node answered CLUSTER SLOTS: {error}")

    def _node(self, node: str) -> _Pool:
        pool = self.nodes.get(node)
        if pool is None:
            address = _host_port(node)

            async def resolve() -> Address:
                return address

            pool = self.nodes[node] = _Pool(
                self.s, self.dialer, resolve, self.counters, node, self.max_in_flight
            )
            if self.counters.total:  # found after startup: connect in the background
                pool.maintain()
        return pool

    def _refresh_soon(self) -> None:
        if self._refresher is None:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_bg())

    async def _refresh_bg(self) -> None:
        try:
            await self.refresh()
        except BackendError as exc:
            log.warning("redis cluster slot refresh failed: %s", exc)
        finally:
            self._refresher = None

    async def _run(self, cmds: list[tuple[int, bytes]]) -> list[Any]:
        """Route commands by slot (one pipeline per node), following MOVED / ASK."""
        replies: list[Any] = [None] * len(cmds)
        slots = self.slots
        todo: list[tuple[int, str | None, bool]] = [
            (i, slots[slot], False) for i, (slot, _) in enumerate(cmds)
        ]
        for _ in range(_MAX_REDIRECTS):
            groups: dict[str | None, list[tuple[int, bool]]] = {}
            for i, node, asking in todo:
                groups.setdefault(node, []).append((i, asking))
            sent = []
            for node, items in groups.items():
                if node is None:
                    raise BackendError("redis cluster slot not covered")
                payload = b"".join(
                    resp.ASKING + cmds[i][1] if asking else cmds[i][1] for i, asking in items
                )
                n = len(items) + sum(asking for _, asking in items)
                sent.append((items, n, self._node(node).submit(payload, n)))
            todo = []
            for items, n, submitted in sent:
                result = await _replies(submitted, n)
                pos = 0
                for i, asking in items:
                    pos += asking
                    reply = result[pos]
                    pos += 1
                    if isinstance(reply, ReplyError):
                        text = str(reply)
                        if text.startswith(("MOVED ", "ASK ")):
                            kind, slot, target = text.split()
                            self.redirects += 1
                            self.asks += kind == "ASK"
                            if kind == "MOVED":
                                self.slots[int(slot)] = target
                                self._refresh_soon()
                            todo.append((i, target, kind == "ASK"))
                            continue
                    replies[i] = reply
            if not todo:
                return replies
            todo.sort()
        raise BackendError("too many redis cluster redirections")

    async def incr_expire(self, ops: Sequence[Op]) -> list[Any]:
        """INCRBY + EXPIRE per op, grouped per node (`decide` when an op has an algorithm)."""
        for op in ops:
            if op.algorithm:
                return await self.decide(ops)
        cmds: list[tuple[int, bytes]] = []
        for op in ops:
            k = op.key.encode()
            slot = key_slot(k)
            cmds.append((slot, resp.incrby(k, op.hits)))
            cmds.append((slot, resp.expire(k, self._jittered(op.seconds))))
        replies = await self._run(cmds)
        for reply in replies:
            if reply.__class__ is not int:
                self._raise_reply(reply)
        return replies[::2]

    async def get(self, keys: Sequence[str]) -> list[int]:
        """GET per key, grouped per node."""
        cmds = []
        for key in keys:
            k = key.encode()
            cmds.append((key_slot(k), resp.get(k)))
        out = []
        for reply in await self._run(cmds):
            if reply is None:
                out.append(0)
            elif reply.__class__ is bytes:
                out.append(int(reply))
            else:
                self._raise_reply(reply)
        return out

    async def close(self) -> None:
        """Stop refreshing, close every pool."""
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        await super().close()


def _instance(
    s: RedisSettings, jitter: int, on_change: Callable[[], None], max_in_flight: int
) -> RedisInstance:
    if s.type == "cluster":
        return ClusterInstance(s, jitter, on_change, max_in_flight)
    return SingleInstance(s, jitter, on_change, max_in_flight)


class RedisBackend:
    """The Backend protocol over a main and an optional per-second Redis instance."""

    name = "redis"
    algorithms = frozenset({FIXED_WINDOW, SLIDING_WINDOW, TOKEN_BUCKET})

    def __init__(
        self,
        main: RedisSettings,
        per_second: RedisSettings | None = None,
        *,
        jitter_max_seconds: int = 0,
        health: Health | None = None,
        stats: StatsStore | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.health = health
        # REDIS_HEALTH_CHECK_ACTIVE_CONNECTION: the per-second instance shares the main one's.
        self.health_check = main.health_check_active_connection
        self.connected = False
        changed = self._connections_changed
        self.main = _instance(main, jitter_max_seconds, changed, max_in_flight)
        self.per_second = (
            _instance(per_second, jitter_max_seconds, changed, max_in_flight)
            if per_second is not None
            else None
        )
        if self.per_second is None:
            # The hot path without a routing frame: one coroutine per request, not two.
            self.increment = self.main.incr_expire  # type: ignore[method-assign]
        if health is not None and "backend" not in health.components():
            health.register("backend", False)
        if stats is not None:
            labels = ("redis_pool", "redis_per_second_pool")
            for label, inst in zip(labels, self.instances(), strict=False):
                c = inst.counters
                scope = f"ratelimit.{label}."
                stats.add_gauge(scope + "cx_active", lambda c=c: c.active)  # type: ignore[misc]
                stats.add_gauge(scope + "cx_total", lambda c=c: c.total)  # type: ignore[misc]
                stats.add_gauge(scope + "cx_local_close", lambda c=c: c.local_close)  # type: ignore[misc]
                # Extension: pipelined flushes so far, i.e. Redis round trips (writes).
                stats.add_gauge(scope + "pipeline_writes", lambda i=inst: i.writes)  # type: ignore[misc]

    def instances(self) -> list[RedisInstance]:
        """The main instance, then the per-second one when configured."""
        return [self.main] if self.per_second is None else [self.main, self.per_second]

    @property
    def writes(self) -> int:
        """Pipelined flushes (Redis round trips) of all instances so far."""
        return sum(i.writes for i in self.instances())

    def _connections_changed(self) -> None:
        if self.health is not None and self.health_check and self.connected:
            self.health.set("backend", all(i.counters.active > 0 for i in self.instances()))

    async def connect(self) -> None:
        """Startup: connect + PING every instance with retry; then report healthy.

        Raises BackendError `timed out waiting for Redis connection to <url> after <d>:
        <err>` once REDIS_STARTUP_MAX_ELAPSED_TIME (0 = forever) has passed.
        """
        for inst in self.instances():
            await inst.start()
        self.connected = True
        if self.health is not None:
            self.health.set("backend", True)
        self._connections_changed()

    async def increment(self, ops: Sequence[Op]) -> list[Any]:
        """INCRBY key hits + EXPIRE key unit+jitter per op (a script call for a sliding
        window or token bucket); main first, then per-second (SECOND-unit limits)."""
        per_second = self.per_second
        if per_second is None:
            return await self.main.incr_expire(ops)
        main_idx = [j for j, op in enumerate(ops) if not (op.per_second or op.seconds == 1)]
        second_idx = [j for j, op in enumerate(ops) if op.per_second or op.seconds == 1]
        out: list[Any] = [0] * len(ops)
        if main_idx:
            for j, value in zip(
                main_idx, await self.main.incr_expire([ops[j] for j in main_idx]), strict=True
            ):
                out[j] = value
        if second_idx:
            for j, value in zip(
                second_idx,
                await per_second.incr_expire([ops[j] for j in second_idx]),
                strict=True,
            ):
                out[j] = value
        return out

    async def get(self, ops: Sequence[Op]) -> list[int]:
        """GET per key (0 when absent), routed as `increment` routes; the level of a
        sliding window or token bucket, counting nothing."""
        per_second = self.per_second
        decided = any(op.algorithm for op in ops)
        if per_second is None:
            if decided:
                return await self.main.decide(ops, peek=True)
            return await self.main.get([op.key for op in ops])
        out = [0] * len(ops)
        main_idx = [j for j, op in enumerate(ops) if not (op.per_second or op.seconds == 1)]
        second_idx = [j for j, op in enumerate(ops) if op.per_second or op.seconds == 1]
        for inst, idx in ((self.main, main_idx), (per_second, second_idx)):
            if idx:
                if decided:
                    values = await inst.decide([ops[j] for j in idx], peek=True)
                else:
                    values = await inst.get([ops[j].key for j in idx])
                for j, value in zip(idx, values, strict=True):
                    out[j] = value
        return out

    async def close(self) -> None:
        """Close every connection; later requests fail with BackendError."""
        for inst in self.instances():
            await inst.close()


def create_redis_backend(
    settings: Settings, health: Health | None = None, stats: StatsStore | None = None
) -> RedisBackend:
    """The registry factory: a RedisBackend from Settings (await `connect()` before serving).

    Must be called with a running event loop (the pools bind to it).
    """
    return RedisBackend(
        settings.redis,
        settings.redis_persecond,
        jitter_max_seconds=settings.cache.expiration_jitter_max_seconds,
        health=health,
        stats=stats,
    )
