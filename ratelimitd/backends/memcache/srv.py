"""MEMCACHE_SRV: the node list from a DNS SRV lookup, sorted as `target:port` strings.

Python's stdlib has no SRV lookup: this is a minimal DNS client (one UDP query to the first
resolv.conf nameserver, TCP on truncation).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import socket
import struct

from ..base import BackendError

_SRV_NAME = re.compile(r"^_(.+?)\._(.+?)\.(.+)$")


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


async def _udp_exchange(nameserver: tuple[str, int], query: bytes, timeout: float) -> bytes:
    """Send one datagram and return the first one back, on a socket owned here and closed
    whatever happens. (uvloop's create_datagram_endpoint, cancelled at the wrong moment,
    leaves its transport open and unowned; loop.close() then waits for it forever.)"""
    loop = asyncio.get_running_loop()
    family, _, _, _, address = (await loop.getaddrinfo(*nameserver, type=socket.SOCK_DGRAM))[0]
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.connect(address)
        async with asyncio.timeout(timeout):
            await loop.sock_sendall(sock, query)
            return await loop.sock_recv(sock, 65535)
    finally:
        sock.close()


async def lookup_srv(
    name: str, nameserver: tuple[str, int] | None = None, timeout: float = 2.0
) -> list[tuple[str, int]]:
    """SRV records of `name` from one DNS server (default: resolv.conf's first), UDP then TCP."""
    if nameserver is None:
        nameserver = (_nameservers()[0], 53)
    ident, query = _dns_query(name, 33)
    msg = await _udp_exchange(nameserver, query, timeout)
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
