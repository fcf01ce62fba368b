"""What the clients of one process may hold together: descriptors, connections, the bytes
held for them; and which connection a full listener closes to let a new one in.

21,000 idle TCP connections once used up the process's open-file limit: `/healthcheck`
failed, new gRPC connections hung and the debug port died. So at start the soft
RLIMIT_NOFILE is raised to its hard limit, and every listener admits a client only while
all of them together hold fewer than that limit less FD_RESERVE descriptors: config reloads,
backend connections, logs and the health check always find one. Each listener also has its
own cap (settings.ConnectionLimits), and none takes more than half of the budget.

A listener at its cap (or the process at its budget) does not simply refuse the newcomer:
3,000 idle connections once kept Kubernetes' health probes out until they timed out. It
closes its longest-idle connection that has no request in progress (`Eviction`): first one
that never got as far as a request (a TLS handshake or an HTTP/2 preface never finished, an
HTTP connection that never sent a byte), then the keep-alive connection idle the longest.
Only when every connection has a request in progress is the newcomer closed at once (the
kernel has already completed its handshake), which costs one descriptor for a moment.

The bytes held for clients are bounded per process by `ClientBuffers`: each connection's
own bound (an HTTP/2 connection window, an HTTP body limit, a pipelining queue) times
thousands of connections was no bound at all (100 connections held 570 MB of partial bodies).

`Listener` is what the gRPC server (`h2.H2Server`) and the HTTP/1.1 servers (`http.HttpServer`)
do alike with all this: admit and release against the budget, sweep their timeouts once a
second, drain at shutdown.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import resource
import time
from collections.abc import Callable, Collection
from typing import Generic, Protocol, TypeVar

from ..runtime.allocator import Trimmer

log = logging.getLogger("ratelimitd")

# Descriptors no client connection may take: config files, Redis/memcached pools, the stats
# sink, xDS, logs, and the listeners themselves.
FD_RESERVE = 256
# At most one "refused" log line per this many seconds (a flood must not flood the log).
_LOG_EVERY = 10.0
# MAX_BUFFERED_BYTES' default: room for 15 maximal gRPC messages at once.
DEFAULT_BUFFERED_BYTES = 64 * 1024 * 1024
# How often a listener enforces its timeouts (`Listener.sweep`).
SWEEP_SECONDS = 1.0


def raise_nofile() -> int:
    """Raise the soft open-file limit to the hard one; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft


class ClientBuffers:
    """Bytes held for clients across every connection of the process (MAX_BUFFERED_BYTES).

    A transport `take`s what it must keep past the read that brought it: a request not read
    whole (its head, its announced body), requests queued or waiting for an asynchronous
    decision, replies the peer's flow control holds back; and `give`s it back once that is
    over. What does not fit is refused (gRPC RESOURCE_EXHAUSTED or RST_STREAM CANCEL, HTTP
    503) with `refusal`, and its bytes freed. What is read, decided and answered within one
    read is never charged.

    Slots: the native transport takes and gives through them, in C (`_h2`), for every call
    that waits on the store.
    """

    __slots__ = ("held", "limit", "refusal", "refused", "trimmer")

    def __init__(self, limit: int = DEFAULT_BUFFERED_BYTES, trimmer: Trimmer | None = None):
        self.limit = limit
        self.held = 0
        self.refused = 0
        self.trimmer = trimmer
        self.refusal = (
            f"request refused: clients already hold MAX_BUFFERED_BYTES ({limit} bytes) of "
            "this process's buffers"
        )

    def take(self, n: int) -> bool:
        """Reserve `n` bytes; False (and nothing taken) when they do not fit."""
        if self.held + n > self.limit:
            self.refused += 1
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        """Release bytes `take` reserved."""
        self.held -= n
        trimmer = self.trimmer
        if trimmer is not None:
            # `trimmer.freed(n)`, its first step inline: below `wake` pending it does
            # nothing else, and an answered call gives back a few hundred bytes.
            trimmer.pending += n
            if trimmer.pending >= trimmer.wake:
                trimmer.freed(0)


class ConnectionBudget:
    """What the clients of every listener of this process hold together: connections
    (descriptors); in `buffers`, the bytes held for their requests and replies; in
    `answers`, the large answers made for the operator's listeners (rendered expositions)
    while they are sent.

    The two byte pools are apart so that scrapers that do not read (each holding a render
    until HTTP_WRITE_TIMEOUT) can only run out of `answers` (their scrapes get 503), never
    make a decision be refused: Envoy fails open on a refused call, so a full `buffers` is a
    limit switched off. `answers` is half of MAX_BUFFERED_BYTES.
    """

    def __init__(
        self,
        total: int,
        buffers: ClientBuffers | None = None,
        answers: ClientBuffers | None = None,
    ) -> None:
        self.total = total
        self.open = 0
        self.refused = 0
        self.evicted = 0
        self._logged = 0.0
        self.buffers = buffers if buffers is not None else ClientBuffers()
        self.answers = answers if answers is not None else ClientBuffers(self.buffers.limit // 2)
        self.trimmer = self.buffers.trimmer

    @classmethod
    def for_process(cls, buffered_bytes: int = DEFAULT_BUFFERED_BYTES) -> ConnectionBudget:
        """The budget of a process whose soft RLIMIT_NOFILE was just raised."""
        buffers = ClientBuffers(buffered_bytes, Trimmer())
        return cls(max(16, raise_nofile() - FD_RESERVE), buffers)

    def has_room(self, held: int, cap: int) -> bool:
        """Whether a listener holding `held` of its `cap` may take one more connection.

        No listener takes more than half the budget: a flood on one (idle HTTP connections,
        say) leaves the other half to the others (Envoy's gRPC connections, say).
        """
        return held < cap and held < self.total // 2 and self.open < self.total

    def admit(
        self,
        listener: str,
        connections: Collection[Evictable],
        cap: int,
        eviction: Eviction | None = None,
    ) -> bool:
        """Take one connection for `listener` (holding `connections` of its `cap`); when full,
        close its idlest connection first (`eviction`), or refuse the newcomer."""
        if not self.has_room(len(connections), cap):
            if eviction is None or not eviction.evict(connections):
                self.refused += 1
                self._warn("refusing", listener, len(connections), cap)
                return False
            self.evicted += 1
            self._warn("closing idle", listener, len(connections), cap)
        self.open += 1
        return True

    def release(self) -> None:
        """Give back a connection `admit` took."""
        self.open -= 1

    def _warn(self, doing: str, listener: str, held: int, cap: int) -> None:
        now = time.monotonic()
        if now - self._logged >= _LOG_EVERY:
            self._logged = now
            log.warning(
                "%s %s connections: %d of its %d held, %d of %d for all listeners "
                "(%d refused, %d idle ones closed so far)",
                doing,
                listener,
                held,
                cap,
                self.open,
                self.total,
                self.refused,
                self.evicted,
            )


IdleKey = tuple[int, float]
# After a scan that found no idle connection, how long a full listener refuses newcomers
# without scanning again.
NOTHING_IDLE_SECONDS = 0.1
# First in line: connections that never got as far as a request (key (NEVER_USED, accepted)).
NEVER_USED, USED = 0, 1


class Evictable(Protocol):
    """A connection as `Eviction` sees it."""

    def idle_key(self) -> IdleKey | None:
        """None while a request is in progress; else (NEVER_USED or USED, since when idle):
        the smallest key is closed first."""

    def evict(self) -> None:
        """Close now, giving back the connection's slot at once."""


class Eviction:
    """A listener's choice of the connection to close when it is full.

    Scanning every connection at each admission would cost a full listener O(connections)
    per new client, which a reconnecting flood turns into a busy loop; so one scan keeps the
    idlest sixteenth in order and the next admissions take from it, each checked again, and
    a scan that found nothing idle is not repeated for NOTHING_IDLE_SECONDS.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._candidates: list[tuple[IdleKey, int, Evictable]] = []
        self._clock = clock
        self._nothing_idle_until = 0.0

    def evict(self, connections: Collection[Evictable]) -> bool:
        """Close the idlest of `connections`; False when every one has a request going."""
        if self._nothing_idle_until and self._clock() < self._nothing_idle_until:
            return False
        for attempt in range(2):
            candidates = self._candidates
            while candidates:
                _, _, conn = candidates.pop()
                if conn in connections and conn.idle_key() is not None:
                    conn.evict()
                    return True
            if attempt:
                break
            idle = [
                (key, id(conn), conn)
                for conn in connections
                if (key := conn.idle_key()) is not None
            ]
            kept = heapq.nsmallest(max(16, len(connections) // 16), idle)
            kept.reverse()  # pop() takes from the end: the idlest last
            self._candidates = kept
        self._nothing_idle_until = self._clock() + NOTHING_IDLE_SECONDS
        return False


class Connection(Evictable, Protocol):
    """A connection as its `Listener` sees it."""

    def abort(self) -> None:
        """Drop the connection now (the end of a drain)."""


C = TypeVar("C", bound=Connection)


class Listener(Generic[C]):
    """What every listener does alike: its own cap and its share of the process's
    `ConnectionBudget`, the connections it holds and the idlest it closes to let a new one
    in, a sweep of its timeouts every SWEEP_SECONDS while it listens, and the end of its
    drain. What a timeout means, and how a connection is told to finish, is the subclass's
    (`sweep`, the `stop` or `close` that calls `drain`).
    """

    def __init__(
        self,
        name: str,
        *,
        max_connections: int,
        read_timeout: float,
        write_timeout: float,
        budget: ConnectionBudget | None,
    ) -> None:
        self.name = name  # the listener's name in the budget's log lines
        self.max_connections = max_connections
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        # Shared with the process's other listeners (None: this listener's own, of its cap).
        self.budget = budget if budget is not None else ConnectionBudget(max_connections)
        self.eviction = Eviction()
        self.connections: set[C] = set()
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by start
        self._sweeper: asyncio.TimerHandle | None = None

    def admit(self) -> bool:
        """Whether a new client may stay (this listener's cap, the process's budget)."""
        return self.budget.admit(self.name, self.connections, self.max_connections, self.eviction)

    def release(self) -> None:
        """A client admitted by `admit` is gone."""
        self.budget.release()

    def sweep(self) -> None:
        """Close or answer what is past its timeout; runs every SWEEP_SECONDS."""
        raise NotImplementedError

    def start_sweeping(self) -> None:
        """Sweep from now on (once however many sockets the listener binds)."""
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(SWEEP_SECONDS, self._sweep_and_rearm)

    def stop_sweeping(self) -> None:
        """No more sweeps (shutdown)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def _sweep_and_rearm(self) -> None:
        self.sweep()
        self._sweeper = self.loop.call_later(SWEEP_SECONDS, self._sweep_and_rearm)

    async def drain(self, grace: float | None) -> None:
        """Wait for the connections, already told to finish, to close: `grace` seconds at
        most (None: as long as they take); then drop the ones left."""
        deadline = None if grace is None else self.loop.time() + grace
        while self.connections and (deadline is None or self.loop.time() < deadline):
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.abort()
