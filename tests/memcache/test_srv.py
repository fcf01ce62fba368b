"""MEMCACHE_SRV through the backend's own DNS client, against a DNS responder made here."""

from __future__ import annotations

import asyncio
import gc
import socket
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from support import free_port, wait_until

from ratelimitd.backends.base import BackendError, Op
from ratelimitd.backends.memcache import MemcacheBackend, servers_from_srv

NAME = "_memcache._tcp.cache.test"


def encode_name(name: str) -> bytes:
    """A DNS name in wire format (no compression)."""
    return b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"


class SrvResponder(asyncio.DatagramProtocol):
    """Answers every query with the SRV records in `records` ((target, port) pairs).

    With `truncate`, UDP answers carry only the TC bit, so the client must ask over TCP
    (`serve_tcp`, on the same port number).
    """

    def __init__(self) -> None:
        self.records: list[tuple[str, int]] = []
        self.queries: list[str] = []
        self.truncate = False
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def answer(self, query: bytes, truncated: bool = False) -> bytes:
        """The response to one query."""
        question = query[12:]
        labels, pos = [], 0
        while question[pos]:
            labels.append(question[pos + 1 : pos + 1 + question[pos]].decode())
            pos += 1 + question[pos]
        self.queries.append(".".join(labels))
        question = question[: pos + 5]
        records = [] if truncated else self.records
        answers = b""
        for i, (target, port) in enumerate(records):
            rdata = struct.pack(">HHH", 10, i, port) + encode_name(target)
            # The owner name as a pointer to the question (offset 12), as real servers do.
            answers += struct.pack(">HHHIH", 0xC00C, 33, 1, 60, len(rdata)) + rdata
        flags = 0x8380 if truncated else 0x8180
        return query[:2] + struct.pack(">HHHHH", flags, 1, len(records), 0, 0) + question + answers

    def datagram_received(self, data: bytes, addr: Any) -> None:
        assert self.transport is not None
        self.transport.sendto(self.answer(data, self.truncate), addr)

    async def serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """DNS over TCP: two-byte length prefixes."""
        (size,) = struct.unpack(">H", await reader.readexactly(2))
        response = self.answer(await reader.readexactly(size))
        writer.write(struct.pack(">H", len(response)) + response)
        await writer.drain()
        writer.close()


@pytest.fixture
async def dns() -> AsyncIterator[tuple[SrvResponder, tuple[str, int]]]:
    """A DNS responder on a free UDP and TCP port: (responder, (host, port))."""
    loop = asyncio.get_running_loop()
    for attempt in range(10):  # the free UDP port's TCP twin may be taken: pick another
        transport, responder = await loop.create_datagram_endpoint(
            SrvResponder, local_addr=("127.0.0.1", 0)
        )
        host, port = transport.get_extra_info("sockname")[:2]
        try:
            server = await asyncio.start_server(responder.serve_tcp, host, port)
            break
        except OSError:
            transport.close()
            if attempt == 9:
                raise
    yield responder, (host, port)
    server.close()
    transport.close()


async def test_srv_targets_sorted_used_and_refreshed(
    memcached: Callable[..., Any], dns: tuple[SrvResponder, tuple[str, int]]
) -> None:
    responder, nameserver = dns
    a, b = memcached(), memcached()
    responder.records = [("localhost.", b.port), ("localhost.", a.port)]
    expected = sorted([f"localhost.:{a.port}", f"localhost.:{b.port}"])
    assert await servers_from_srv(NAME, nameserver) == expected
    assert responder.queries == [NAME]

    backend = MemcacheBackend(srv=NAME, srv_refresh=0.05, srv_nameserver=nameserver)
    try:
        await backend.connect()
        assert backend.servers == expected
        await backend.increment([Op("d_k_a_999960", 1, 60), Op("d_k_b_999960", 1, 60)])
        await backend.flush()
        first = a if expected[0].endswith(f":{a.port}") else b
        second = b if first is a else a
        # The gomemcache selector over the sorted list: crc32 % 2 = 0 and 1.
        assert first.value("d_k_a_999960") == 1
        assert second.value("d_k_b_999960") == 1

        responder.records = [("localhost.", a.port)]
        await wait_until(lambda: backend.servers == [f"localhost.:{a.port}"], what="SRV refresh")
        await backend.increment([Op("d_k_b_999960", 1, 60)])
        await backend.flush()
        assert a.value("d_k_b_999960") == (2 if second is a else 1)

        # A failed refresh keeps the last list.
        responder.records = []
        await asyncio.sleep(0.15)
        assert backend.servers == [f"localhost.:{a.port}"]
    finally:
        await backend.close()


async def test_srv_failures(dns: tuple[SrvResponder, tuple[str, int]]) -> None:
    _, nameserver = dns
    with pytest.raises(BackendError, match="Unable to fetch servers from SRV"):
        await servers_from_srv(NAME, nameserver)  # no records
    with pytest.raises(BackendError, match="Unable to fetch servers from SRV"):
        await servers_from_srv(NAME, ("127.0.0.1", free_port()))  # no DNS server there
    with pytest.raises(BackendError, match="Invalid SRV string"):
        await servers_from_srv("memcache.tcp.cache.test", nameserver)
    backend = MemcacheBackend(srv=NAME, srv_nameserver=nameserver)
    with pytest.raises(BackendError, match="Unable to fetch servers from SRV"):
        await backend.connect()
    await backend.close()


async def test_srv_truncated_udp_answer_retried_over_tcp(
    dns: tuple[SrvResponder, tuple[str, int]],
) -> None:
    responder, nameserver = dns
    responder.truncate = True
    responder.records = [("m2.cache.test.", 11211), ("m1.cache.test.", 11211)]
    servers = await servers_from_srv(NAME, nameserver)
    assert servers == ["m1.cache.test.:11211", "m2.cache.test.:11211"]
    assert responder.queries == [NAME, NAME]  # once over UDP, once over TCP


async def test_a_cancelled_lookup_leaves_no_transport_open() -> None:
    """The SRV refresher is cancelled when the backend closes, at whatever await the lookup
    is in. Nothing may stay open then: uvloop's close() waits for every open handle, and a
    lost datagram transport hung a run of test_srv_targets_sorted_used_and_refreshed at its
    teardown (about 1 run in 20)."""
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # never answers
    silent.bind(("127.0.0.1", 0))
    try:
        for _ in range(3):
            for yields in range(60):
                task = asyncio.ensure_future(servers_from_srv(NAME, silent.getsockname()))
                for _ in range(yields):
                    await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        gc.collect()
        left = [
            o
            for o in gc.get_objects()
            # uvloop's transports are not asyncio.BaseTransport subclasses
            if type(o).__name__.endswith("Transport") and not o.is_closing()
        ]
        for transport in left:
            transport.close()  # so that a failure fails instead of hanging the loop's close
        assert left == []
    finally:
        silent.close()
