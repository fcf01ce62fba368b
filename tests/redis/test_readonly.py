"""REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR (upstream #1191): a failover done by re-pointing an
address (a Kubernetes Service, DNS, a proxy) leaves pooled connections on the demoted master,
which answers every write with READONLY. With the setting a READONLY reply drops the pool's
connections and the re-dial reaches whatever the address points at now; without it the
connections stay, as the reference's default keeps them."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from support import wait_for
from support.core import single_rule

from ratelimitd.backends.base import BackendError
from ratelimitd.messages import OK

CONFIG = single_rule("d", "hour", 1000)


class Repointable:
    """A TCP forwarder on a fixed port whose target can change: connections opened after
    `target` changes go to the new server, the open ones stay where they were."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._forward, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            finally:
                dst.close()

        await asyncio.gather(
            pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True
        )

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)


@pytest.mark.parametrize("close", [True, False], ids=["close-on-readonly", "default"])
async def test_readonly_reply_redials_only_when_asked(servers, decider, close: bool) -> None:
    master = servers("--repl-diskless-sync-delay", "0")
    replica = servers(
        "--replicaof", "127.0.0.1", str(master.port), "--repl-diskless-sync-delay", "0"
    )
    wait_for(
        lambda: replica.client().info("replication")["master_link_status"] == "up",
        what="replication",
    )
    proxy = Repointable(replica.port)  # the address points at a demoted master
    await proxy.start()
    env = {"REDIS_URL": f"127.0.0.1:{proxy.port}"}
    if close:
        env["REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR"] = "true"
    try:
        d = await decider(env, CONFIG)
        proxy.target = master.port  # the failover: the address now leads to the master
        with pytest.raises(BackendError, match=r"^READONLY"):
            await d.decide("d", [("k", "a")])
        outcomes = []
        for _ in range(20):
            try:
                outcomes.append((await d.decide("d", [("k", "a")])).overall_code)
            except BackendError as exc:
                assert str(exc).startswith(("READONLY", "no connection"))
                outcomes.append(None)
            await asyncio.sleep(0.025)
        if close:
            # Served by the master once the pool has re-dialled (well within the 0.5 s).
            assert outcomes[-1] == OK
            assert master.client().get(next(iter(master.client().keys("d_k_a_*")))) is not None
        else:
            # The pooled connections stay on the demoted master: every write still fails.
            assert outcomes == [None] * 20
            assert master.client().keys("d_k_a_*") == []
    finally:
        await proxy.close()
