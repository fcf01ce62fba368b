"""One Redis deployment behind the backend: what every topology shares (`RedisInstance`),
and a single server or a sentinel-named master (`SingleInstance`). A cluster
(`ClusterInstance`, commands routed by hash slot) is in `cluster.py`."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import hiredis

from ...config.budget_store import MAX_BUDGET_TXNS, eligible
from ...config.keys import COUNTER_MAX
from ...config.windows import FIXED_WINDOW, SLIDING_WINDOW, TOKEN_BUCKET
from ...runtime.aio import cancel
from ...settings import RedisSettings, redis_auth
from ..base import BackendError, Op, Waiter, client_ssl_context
from ..breaker import Breaker
from . import budget, resp, rounds, scripts
from .claim_scripts import SCRIPTS as claims_scripts
from .claims import Claims
from .pool import (
    MAX_IN_FLIGHT,
    Address,
    Counters,
    Dialer,
    Pool,
    await_replies,
    host_port,
)
from .resp import ReplyError, key_slot

log = logging.getLogger("ratelimitd.backends.redis")

_WATCH_RETRY = 1.0  # seconds between rounds over the sentinels when none keeps a subscription


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


# The hash fields the scripts keep a decided limit's state in (see `scripts`).
_STATE_FIELDS = {SLIDING_WINDOW: (b"w", b"c", b"p"), TOKEN_BUCKET: (b"t", b"f")}


class RedisInstance:
    """One Redis deployment (single, sentinel or cluster) with its pool(s)."""

    # Commands carry their key's hash slot (a cluster routes by it; others ignore it).
    routed = False
    # The breaker guarding this instance (BACKEND_BREAKER_*), which counts the calls of
    # `increment_later` itself (`Breaker.call` counts the awaited ones); set by the guard.
    breaker: Breaker | None = None
    # The transactions one token budget may hold (BUDGET_MAX_TRANSACTIONS); set by the backend.
    budget_max_transactions = MAX_BUDGET_TXNS
    _claims: Claims | None = None

    @property
    def claims(self) -> Claims:
        """The budgets this instance keeps in plain commands (`claims`)."""
        if self._claims is None:
            self._claims = Claims(self)
        return self._claims

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
        self.counters = Counters(on_change)
        self.dialer = Dialer(s, client_ssl_context(s, "REDIS_") if s.tls else None)
        self._configure(s)

    def _configure(self, s: RedisSettings) -> None:
        """The deployment's own shape, read from the settings (a subclass's constructor)."""
        raise NotImplementedError

    @property
    def writes(self) -> int:
        """Flushes (transport writes of pipelined requests) so far."""
        return sum(p.writes for p in self.pools())

    def pools(self) -> list[Pool]:
        """Every connection pool of this instance."""
        raise NotImplementedError

    async def open(self) -> None:
        """One connection attempt for the startup loop."""
        raise NotImplementedError

    async def dial_if_down(self) -> None:
        """Before a breaker's probe: dial every pool that has no connection up."""
        for pool in self.pools():
            await pool.dial_if_down()

    async def incr_expire(self, ops: Sequence[Op]) -> list[int]:
        """INCRBY + EXPIRE per op; the counters."""
        raise NotImplementedError

    def increment_later(self, ops: Sequence[Op], waiter: Waiter) -> bool:
        """`incr_expire` without a coroutine where the deployment allows
        (`PipelinedBackend.increment_later`); False: await `incr_expire`."""
        return False

    async def get(self, keys: Sequence[str]) -> list[int]:
        """GET per key (0 when absent)."""
        raise NotImplementedError

    async def levels(self, ops: Sequence[Op]) -> list[int]:
        """The current level of each op's limit, counting nothing: a counter (GET), or a
        sliding window's or token bucket's level (its script with no hits)."""
        if any(op.algorithm != FIXED_WINDOW for op in ops):
            return await self.decide(ops, peek=True)
        return await self.get([op.key for op in ops])

    async def _run(self, cmds: list[tuple[int, bytes]]) -> list[Any]:
        """One reply per (slot, command), all sent in one round (per node)."""
        raise NotImplementedError

    async def delete(self, keys: Sequence[str]) -> int:
        """DEL per key in one round (routed per slot on a cluster); how many existed."""
        cluster = self.routed
        cmds = []
        for key in keys:
            k = key.encode()
            cmds.append((key_slot(k) if cluster else 0, resp.command("DEL", key)))
        found = 0
        for reply in await self._run(cmds):
            if reply.__class__ is not int:
                self._raise_reply(reply)
            found += reply
        return found

    async def decide(self, ops: Sequence[Op], *, peek: bool = False) -> list[Any]:
        """Ops of any algorithm in one round: INCRBY + EXPIRE (GET with `peek`) for a fixed
        window, the script's call for the others (`(level, ticks until reset)`, the level
        alone with `peek`), the refund script for a refund (the counter after); a budget
        call kept in commands (`claims`) in its own rounds, after."""
        claimed = [j for j, op in enumerate(ops) if op.budget is not None and eligible(op.budget)]
        if claimed:
            kept = set(claimed)
            rest = [op for j, op in enumerate(ops) if j not in kept]
            merged = await self.decide(rest, peek=peek) if rest else []
            results = await self.claims.run([ops[j].budget for j in claimed])  # type: ignore[misc]
            for j, result in zip(claimed, results, strict=True):
                merged.insert(j, result)
            return merged
        cluster = self.routed
        cmds: list[tuple[int, bytes]] = []
        owner: list[int] = []  # the op of each command
        ttl: dict[int, int] = {}  # a refund's TTL, for its EVAL after a NOSCRIPT
        for j, op in enumerate(ops):
            k = op.key.encode()
            slot = key_slot(k) if cluster else 0
            if op.refund:
                ttl[j] = self._jittered(op.seconds)
                cmds.append((slot, scripts.refund(k, op.hits, ttl[j])))
                owner.append(j)
            elif op.budget is not None:
                cmds.append((slot, budget.encode(op.budget, self.budget_max_transactions)))
                owner.append(j)
            elif op.algorithm != FIXED_WINDOW:
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
            again = []
            for i in missing:
                j = owner[i]
                op, k = ops[j], ops[j].key.encode()
                if op.refund:
                    again.append((cmds[i][0], scripts.refund(k, op.hits, ttl[j], load=True)))
                elif op.budget is not None:
                    most = self.budget_max_transactions
                    again.append((cmds[i][0], budget.encode(op.budget, most, load=True)))
                else:
                    again.append((cmds[i][0], scripts.call(op, k, peek=peek, load=True)))
            for i, reply in zip(missing, await self._run(again), strict=True):
                replies[i] = reply
        out: list[Any] = []
        i = 0
        for op in ops:
            reply = replies[i]
            if op.refund:
                if reply.__class__ is not int:
                    self._fail(reply)
                out.append(reply)
                i += 1
            elif op.budget is not None:
                out.append(budget.decode(reply))
                i += 1
            elif op.algorithm != FIXED_WINDOW:
                if reply.__class__ is not list:
                    self._fail(reply)
                out.append(reply[0] if peek else (reply[0], reply[1]))
                i += 1
            elif peek:
                out.append(self._value(reply))
                i += 1
            else:
                if reply.__class__ is not int:
                    reply = self._counted(reply)
                if replies[i + 1].__class__ is not int:
                    self._fail(replies[i + 1])
                out.append(reply)
                i += 2
        return out

    async def states(self, ops: Sequence[Op]) -> list[Any]:
        """Each op's stored state, as the memory store keeps it (`memory.simulate`): a
        counter (GET), a sliding window's (w, c, p) or a token bucket's (t, f) (HMGET of the
        script's fields); None when absent. One round, nothing written."""
        cluster = self.routed
        cmds = []
        for op in ops:
            k = op.key.encode()
            fields = _STATE_FIELDS.get(op.algorithm) if not op.refund else None
            cmd = resp.command("HMGET", k, *fields) if fields else resp.get(k)
            cmds.append((key_slot(k) if cluster else 0, cmd))
        out: list[Any] = []
        for op, reply in zip(ops, await self._run(cmds), strict=True):
            if op.algorithm != FIXED_WINDOW and not op.refund:
                if reply.__class__ is not list:
                    self._fail(reply)
                out.append(None if reply[0] is None else tuple(int(v or 0) for v in reply))
            else:
                out.append(None if reply is None else self._value(reply))
        return out

    def _fail(self, reply: Any) -> None:
        self._raise_reply(reply)

    def _value(self, reply: Any) -> int:
        """A GET reply as a counter: an absent key is 0; anything but a number raises."""
        if reply is None:
            return 0
        if reply.__class__ is not bytes:
            self._fail(reply)
        return int(reply)

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

    async def warm(self) -> None:
        """Load every script on each server before the daemon reports ready.

        Otherwise the first call of each kind pays a NOSCRIPT round and an EVAL that
        compiles its script: the first budget call after a start once failed with
        `redis request timed out`. A server that refuses SCRIPT LOAD is only logged: the
        calls load what they need themselves.
        """
        sources = [script.source for script in (*scripts.SCRIPTS.values(), scripts.REFUND)]
        sources.append(budget.BUDGET_LUA)
        sources += claims_scripts
        payload = b"".join(resp.command("SCRIPT", "LOAD", source) for source in sources)
        for pool in self.pools():
            for conn in pool.conns[:1]:  # the script cache is the server's
                try:
                    replies = await conn.call(payload, len(sources), self.s.dial_timeout)
                except BackendError as exc:
                    replies = [exc]
                refused = [r for r in replies if isinstance(r, ReplyError | BackendError)]
                if refused:
                    log.warning("redis on %s: scripts not loaded: %s", pool.describe, refused[0])

    async def close(self) -> None:
        """Close every pool."""
        for pool in self.pools():
            await pool.close()

    def _jittered(self, seconds: int) -> int:
        jitter = self.jitter
        return seconds + int(random.random() * jitter) if jitter > 0 else seconds

    def _counted(self, reply: Any) -> int:
        """An INCRBY reply that is not a counter: one Redis refused because it would pass
        2^63-1 is that counter, saturated (docs/compatibility.md); others raise."""
        if isinstance(reply, ReplyError) and str(reply).endswith("would overflow"):
            return COUNTER_MAX
        self._fail(reply)
        raise AssertionError("unreachable")  # _fail raises

    def _incr_counts(self, replies: list[Any], failed: Callable[[Any], None]) -> list[Any]:
        """The counters of INCRBY + EXPIRE reply pairs (`replies` is reused): a failed
        EXPIRE goes to `failed`, which raises; a saturated INCRBY reads as the largest
        counter."""
        for i, reply in enumerate(replies):
            if reply.__class__ is not int:
                if i % 2:
                    failed(reply)
                replies[i] = self._counted(reply)
        return replies[::2]

    def _raise_reply(self, reply: Any) -> None:
        if isinstance(reply, ReplyError):
            raise BackendError(str(reply))
        raise BackendError(f"unexpected redis reply {reply!r}")


class SingleInstance(RedisInstance):
    """A single server, or the master a set of sentinels points at."""

    def _configure(self, s: RedisSettings) -> None:
        self.address: Address
        self.sentinels: list[tuple[str, int]] = []
        self.master_name = ""
        if s.type == "sentinel":
            items = [i.strip() for i in s.url.split(",")]
            self.master_name = items[0]
            self.sentinels = [host_port(i) for i in items[1:]]
            self.address = ("", 0)
            resolve = self._ask_sentinels
            describe = f"sentinel master {self.master_name}"
        else:
            self.address = self._parse_single(s.url)
            resolve = self._static
            describe = s.masked_url
        self.pool = Pool(s, self.dialer, resolve, self.counters, describe, self.max_in_flight)
        self.pool.receiver = rounds.Resolver(self)
        # `incr_expire` without a coroutine (`PipelinedBackend`): fixed-window ops only
        # (False for an algorithm, a refund or a budget call: their scripts may need a
        # second round). Every Redis-backed decision starts here: compiled, it adds the
        # request to the pool's flush without a Python frame (`resp.Sender`).
        self.increment_later = resp.Sender(self.pool, self.jitter)  # type: ignore[method-assign]
        self._watcher: asyncio.Task[None] | None = None

    def _parse_single(self, url: str) -> Address:
        scheme, sep, _ = url.partition("://")
        if not sep:
            if self.s.socket_type == "unix":
                return url
            return host_port(url)
        parts = urllib.parse.urlsplit(url)
        self.dialer.with_url_credentials(
            urllib.parse.unquote(parts.username) if parts.username else None,
            urllib.parse.unquote(parts.password) if parts.password else None,
        )
        if scheme == "unix":
            return parts.path
        if scheme == "rediss" and self.dialer.ssl_context is None:
            self.dialer.ssl_context = client_ssl_context(self.s, "REDIS_")
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

    async def _watch_sentinels(self) -> None:
        """Follow `+switch-master` on one sentinel at a time, so a failover is picked up when
        the sentinels announce it rather than at the next failed request (a demoted master
        keeps taking writes until the sentinels reconfigure it, which may take seconds)."""
        auth = redis_auth(self.s.sentinel_auth)
        while True:
            for sentinel in self.sentinels:
                try:
                    await self._subscribe(sentinel, auth)
                except (
                    OSError,
                    TimeoutError,
                    ssl.SSLError,
                    BackendError,
                    hiredis.HiredisError,
                ) as exc:
                    log.debug("redis sentinel %s:%d subscription: %s", *sentinel, exc)
            await asyncio.sleep(_WATCH_RETRY * (0.5 + random.random()))

    async def _subscribe(
        self, sentinel: tuple[str, int], auth: tuple[str | None, str | None]
    ) -> None:
        """SUBSCRIBE +switch-master on one sentinel; returns when its connection ends."""
        host, port = sentinel
        ctx = self.dialer.ssl_context
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ctx, server_hostname=host if ctx else None),
            self.s.dial_timeout,
        )
        try:
            username, password = auth
            if password is not None:
                args = ("AUTH", username, password) if username else ("AUTH", password)
                writer.write(resp.command(*args))
            writer.write(resp.command("SUBSCRIBE", "+switch-master"))
            parser = hiredis.Reader()
            while data := await reader.read(65536):
                parser.feed(data)
                while (reply := parser.gets()) is not False:
                    if isinstance(reply, ReplyError):
                        raise BackendError(str(reply))
                    if isinstance(reply, list) and reply[0] == b"message":
                        self._switched(reply[2].decode())
        finally:
            writer.close()

    def _switched(self, announcement: str) -> None:
        """`<master name> <old ip> <old port> <new ip> <new port>` from a sentinel."""
        parts = announcement.split()
        if len(parts) != 5 or parts[0] != self.master_name:
            return
        address = (parts[3], int(parts[4]))
        if address != self.address:
            log.warning("redis sentinel master %s switched to %s:%d", self.master_name, *address)
            self.address = address
            self.pool.reset()  # the re-dial asks the sentinels, which name the new master

    def pools(self) -> list[Pool]:
        """The one pool."""
        return [self.pool]

    async def open(self) -> None:
        """Open the pool (at least one connection); with sentinels, watch them."""
        await self.pool.open_all()
        if self.master_name and self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch_sentinels())

    async def close(self) -> None:
        """Stop watching the sentinels, close the pool."""
        await cancel(self._watcher)
        await super().close()

    async def _run(self, cmds: list[tuple[int, bytes]]) -> list[Any]:
        """One pipeline."""
        n = len(cmds)
        return await await_replies(self.pool.submit(b"".join(c for _, c in cmds), n), n)

    def _fail(self, reply: Any) -> None:
        self._failed(reply)

    async def incr_expire(self, ops: Sequence[Op]) -> list[Any]:
        """One pipeline: INCRBY + EXPIRE per op (`decide` for an algorithm, a refund or a
        budget call)."""
        payload = resp.incrby_expire_ops(ops, self.jitter)
        if payload is None:  # a script's op
            op = ops[0]
            if (
                len(ops) == 1
                and op.algorithm != FIXED_WINDOW
                and not op.refund
                and op.budget is None
            ):
                # the common case, without `decide`'s bookkeeping
                fut, offset = self.pool.submit(scripts.call(op, op.key.encode()), 1)
                replies = await fut
                if replies.__class__ is not list:
                    raise BackendError(*replies.args)
                reply = replies[offset]
                if reply.__class__ is list:
                    return [(reply[0], reply[1])]
            return await self.decide(ops)
        n = 2 * len(ops)
        fut, offset = self.pool.submit(payload, n)
        replies = await fut
        if replies.__class__ is not list:
            raise BackendError(*replies.args)  # a fresh instance per request
        return self._counts(replies, offset, n)

    def _counts(self, replies: list[Any], offset: int, n: int) -> list[Any]:
        """The counters of one request's INCRBY + EXPIRE replies (from `offset`, `n` of
        them); a reply that is not a number raises BackendError (a saturated INCRBY reads
        as the largest counter)."""
        if n == 2:
            count = replies[offset]
            if count.__class__ is not int:
                count = self._counted(count)
            if replies[offset + 1].__class__ is not int:
                self._failed(replies[offset + 1])
            return [count]
        return self._incr_counts(replies[offset : offset + n], self._failed)

    async def get(self, keys: Sequence[str]) -> list[int]:
        """One pipeline of GETs."""
        payload = b"".join(resp.get(k.encode()) for k in keys)
        replies = await await_replies(self.pool.submit(payload, len(keys)), len(keys))
        return [self._value(reply) for reply in replies]

    def _failed(self, reply: Any) -> None:
        if (
            (self.master_name or self.s.close_connection_on_readonly)
            and isinstance(reply, ReplyError)
            and str(reply).startswith("READONLY")
        ):
            # A demoted master: re-dial, to the master the sentinels name now, or to
            # whatever the address points at (REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR).
            # Without either the connections stay, as the reference's default keeps them.
            self.pool.reset()
        self._raise_reply(reply)
