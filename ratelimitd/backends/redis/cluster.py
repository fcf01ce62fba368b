"""A Redis Cluster behind the backend (REDIS_TYPE=cluster): a pool per master, a slot map
from CLUSTER SLOTS, commands grouped per node, MOVED and ASK followed."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any

from ...config.windows import FIXED_WINDOW
from ...runtime.aio import cancel
from ...settings import RedisSettings
from ..base import BackendError, Op
from . import resp
from .instances import RedisInstance, log
from .pool import Address, Pool, await_replies, host_port
from .resp import _SLOTS, ReplyError, key_slot

_MAX_REDIRECTS = 5


class ClusterInstance(RedisInstance):
    """A Redis Cluster: a pool per master, commands routed by hash slot."""

    routed = True

    def _configure(self, s: RedisSettings) -> None:
        self.seeds = [host_port(i) for i in s.url.split(",") if i.strip()]
        self.slots: list[str | None] = [None] * _SLOTS
        self.nodes: dict[str, Pool] = {}
        self.redirects = 0  # MOVED + ASK replies followed
        parallelism = s.cluster_pipeline_parallelism
        # 0: every node pipeline at once; N: at most N, capped at the pool size (the reference).
        self.parallelism = min(parallelism, s.pool_size) if parallelism else 0
        self.asks = 0
        self.refreshes = 0
        self._refresher: asyncio.Task[None] | None = None

    def pools(self) -> list[Pool]:
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
        known = [host_port(n) for n in self.nodes] + self.seeds
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

    def _node(self, node: str) -> Pool:
        pool = self.nodes.get(node)
        if pool is None:
            address = host_port(node)

            async def resolve() -> Address:
                return address

            pool = self.nodes[node] = Pool(
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
        """Route commands by slot (one pipeline per node), following MOVED / ASK.

        REDIS_CLUSTER_PIPELINE_PARALLELISM bounds the node pipelines in flight: with 1 (the
        reference's default) a request pays one round trip per node it touches, with 0 one
        round trip whatever it touches.
        """
        replies: list[Any] = [None] * len(cmds)
        slots = self.slots
        todo: list[tuple[int, str | None, bool]] = [
            (i, slots[slot], False) for i, (slot, _) in enumerate(cmds)
        ]
        bound = self.parallelism
        for _ in range(_MAX_REDIRECTS):
            groups: dict[str | None, list[tuple[int, bool]]] = {}
            for i, node, asking in todo:
                groups.setdefault(node, []).append((i, asking))
            if None in groups:
                raise BackendError("redis cluster slot not covered")
            waiting = list(groups.items())
            waiting.reverse()  # popped from the end: first-occurrence order
            sent: collections.deque[tuple[str, list[tuple[int, bool]], int, Any]]
            sent = collections.deque()
            todo = []
            while waiting or sent:
                while waiting and (not bound or len(sent) < bound):
                    node, items = waiting.pop()
                    assert node is not None
                    payload = b"".join(
                        resp.ASKING + cmds[i][1] if asking else cmds[i][1] for i, asking in items
                    )
                    n = len(items) + sum(asking for _, asking in items)
                    sent.append((node, items, n, self._node(node).submit(payload, n)))
                node, items, n, submitted = sent.popleft()
                result = await await_replies(submitted, n)
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
                        if self.s.close_connection_on_readonly and text.startswith("READONLY"):
                            self._node(node).reset()  # a demoted node behind that address
                    replies[i] = reply
            if not todo:
                return replies
            todo.sort()
        raise BackendError("too many redis cluster redirections")

    async def incr_expire(self, ops: Sequence[Op]) -> list[Any]:
        """INCRBY + EXPIRE per op, grouped per node (`decide` for an algorithm or a refund)."""
        for op in ops:
            if op.algorithm != FIXED_WINDOW or op.refund or op.budget is not None:
                return await self.decide(ops)
        cmds: list[tuple[int, bytes]] = []
        for op in ops:
            k = op.key.encode()
            slot = key_slot(k)
            cmds.append((slot, resp.incrby(k, op.hits)))
            cmds.append((slot, resp.expire(k, self._jittered(op.seconds))))
        return self._incr_counts(await self._run(cmds), self._raise_reply)

    async def get(self, keys: Sequence[str]) -> list[int]:
        """GET per key, grouped per node."""
        cmds = []
        for key in keys:
            k = key.encode()
            cmds.append((key_slot(k), resp.get(k)))
        return [self._value(reply) for reply in await self._run(cmds)]

    async def close(self) -> None:
        """Stop refreshing, close every pool."""
        await cancel(self._refresher)
        await super().close()
