"""A raw HTTP/2 client (hyperframe + hpack, the `h2` test dependency): any frame sequence,
malformed or abusive, can be sent, and the server's frames are parsed back. Used by the native
transport's conformance tests and by the attackers of its hardening tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc.aio
from hpack import Decoder, Encoder
from hyperframe.frame import DataFrame, HeadersFrame, SettingsFrame, WindowUpdateFrame

from ratelimitd.messages import OK
from ratelimitd.transport.grpc import METHOD_PATH
from ratelimitd.transport.protocodec import decode_response, encode_request

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
TIMEOUT = 5.0
# RFC 9113 error codes.
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED = 0x0, 0x1, 0x3, 0x5
FRAME_SIZE_ERROR, REFUSED_STREAM, ENHANCE_YOUR_CALM = 0x6, 0x7, 0xB
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
WINDOW_UPDATE = 0x8


def grpc_message(payload: bytes) -> bytes:
    """A gRPC length-prefixed, uncompressed message."""
    return b"\x00" + struct.pack(">I", len(payload)) + payload


# Rules under which every call of REQUEST is answered OK.
CONFIG = """\
domain: test
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1000000}
"""
# One ShouldRateLimit call of domain `test`, descriptor k=v, as a gRPC message.
REQUEST = grpc_message(encode_request("test", [[("k", "v")]]))


async def still_serves(port: int) -> None:
    """A real grpc client on a fresh connection gets a decision."""
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
    ) as channel:
        raw = await channel.unary_unary(METHOD_PATH)(
            encode_request("test", [[("k", "v")]]), timeout=TIMEOUT
        )
    assert decode_response(raw).overall_code == OK


@dataclass
class Frame:
    """One frame the server sent."""

    type: int
    flags: int
    stream: int
    payload: bytes
    # A HEADERS frame's header list, decoded when it arrived (HPACK state is per connection).
    headers: list[tuple[str, str]] | None = None

    def __repr__(self) -> str:
        payload = self.payload if len(self.payload) <= 24 else self.payload[:24] + b"..."
        return f"Frame(type={self.type}, flags={self.flags}, stream={self.stream}, {payload!r})"

    def error_code(self) -> int:
        """RST_STREAM's code, or GOAWAY's."""
        if self.type == RST_STREAM:
            return int(struct.unpack(">I", self.payload[:4])[0])
        return int(struct.unpack(">I", self.payload[4:8])[0])


class Raw:
    """A raw HTTP/2 client connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.frames: list[Frame] = []
        self.closed = False
        # What the server lets us send (RFC 9113 flow control), for `upload`.
        self.connection_window = 65535
        self.initial_window = 65535
        self.windows: dict[int, int] = {}
        # Whether DATA received is acknowledged with WINDOW_UPDATEs (a zero-window attacker
        # never does).
        self.acknowledge = True

    @classmethod
    async def open(
        cls, port: int, preface: bool = True, settings: dict[int, int] | None = None, **kw: Any
    ) -> Raw:
        """Connect; with `preface`, send the preface and a SETTINGS frame (`settings`, or
        empty); `kw` go to asyncio.open_connection (ssl=...)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port, **kw)
        raw = cls(reader, writer)
        if preface:
            raw.send(PREFACE + SettingsFrame(0, settings=settings or {}).serialize())
        return raw

    def send(self, data: bytes) -> None:
        if not self.writer.is_closing():  # a flooding test keeps sending after a GOAWAY
            self.writer.write(data)

    @staticmethod
    def headers(**overrides: Any) -> list[tuple[str, str]]:
        """A gRPC request head; keyword overrides replace values (None drops the header)."""
        base = {
            ":method": "POST",
            ":scheme": "http",
            ":path": METHOD_PATH,
            ":authority": "localhost",
            "content-type": "application/grpc",
            "te": "trailers",
        }
        for name, value in overrides.items():
            key = name.replace("_", "-")
            key = ":" + key[1:] if name.startswith("_") else key
            if value is None:
                base.pop(key, None)
            else:
                base[key] = value
        return list(base.items())

    def block(self, headers: list[tuple[str, str]]) -> bytes:
        """An HPACK header block."""
        return bytes(self.encoder.encode(headers))

    def call(self, stream: int, body: bytes = REQUEST, **headers: Any) -> None:
        """HEADERS + DATA(END_STREAM)."""
        head = HeadersFrame(stream, self.block(self.headers(**headers)), flags=["END_HEADERS"])
        self.send(head.serialize() + DataFrame(stream, body, flags=["END_STREAM"]).serialize())

    async def upload(self, stream: int, body: bytes, end: bool = True, **headers: Any) -> None:
        """HEADERS, then `body` in DATA frames as the server's flow-control windows allow
        (END_STREAM on the last one with `end`), reading frames while they are closed; it
        stops early if the server ends the stream (answers or resets it) meanwhile."""
        head = HeadersFrame(stream, self.block(self.headers(**headers)), flags=["END_HEADERS"])
        self.send(head.serialize())
        self.windows.setdefault(stream, self.initial_window)
        view = memoryview(body)
        seen = len(self.frames)
        while view or end:
            room = min(self.connection_window, self.windows[stream], 16384)
            if room <= 0 and view:
                await self.read_until(
                    lambda f: f.type == WINDOW_UPDATE or (f.stream == stream and f.type != DATA)
                )
                if any(
                    f.stream == stream
                    and (f.type == RST_STREAM or (f.flags & 1 and f.type == HEADERS))
                    for f in self.frames[seen:]
                ):
                    return
                continue
            chunk, view = bytes(view[:room]), view[room:]
            last = end and not view
            self.send(DataFrame(stream, chunk, flags=["END_STREAM"] if last else []).serialize())
            self.connection_window -= len(chunk)
            self.windows[stream] -= len(chunk)
            if last:
                break
            await self.writer.drain()

    async def read_until(
        self, done: Callable[[Frame], bool], timeout: float = TIMEOUT
    ) -> list[Frame]:
        """Frames until one satisfies `done` (or the connection closes); all of them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        start = len(self.frames)
        while True:
            for frame in self.frames[start:]:
                if done(frame):
                    return self.frames[start:]
            start = len(self.frames)
            if self.closed:
                return self.frames
            try:
                head = await asyncio.wait_for(
                    self.reader.readexactly(9), max(0.01, deadline - loop.time())
                )
                length = int.from_bytes(head[:3], "big")
                payload = await self.reader.readexactly(length)
            except (asyncio.IncompleteReadError, ConnectionError):
                self.closed = True
                continue
            except TimeoutError:
                got = len(self.frames)
                raise AssertionError(f"no such frame; got {got}, last {self.frames[-8:]}") from None
            frame = Frame(head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload)
            if frame.type == SETTINGS and not frame.flags & 1:
                self.send(SettingsFrame(0, flags=["ACK"]).serialize())
                self._settings(payload)
            elif frame.type == HEADERS:
                frame.headers = list(self.decoder.decode(header_block(frame)))
            elif frame.type == DATA and payload and self.acknowledge:
                update = WindowUpdateFrame(0, len(payload)).serialize()
                self.send(update + WindowUpdateFrame(frame.stream, len(payload)).serialize())
            elif frame.type == WINDOW_UPDATE:
                increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
                if frame.stream:
                    self.windows[frame.stream] = self.windows.get(frame.stream, 0) + increment
                else:
                    self.connection_window += increment
            self.frames.append(frame)

    def _settings(self, payload: bytes) -> None:
        for ident, value in struct.iter_unpack(">HI", payload):
            if ident == 0x4:  # INITIAL_WINDOW_SIZE: every open stream's window moves too
                for stream in self.windows:
                    self.windows[stream] += value - self.initial_window
                self.initial_window = value

    async def stream_end(self, stream: int) -> dict[str, str]:
        """The headers and trailers of a stream, once it ends (or is reset)."""
        frames = await self.read_until(
            lambda f: (
                (f.stream == stream and (f.flags & 1 and f.type in (DATA, HEADERS)))
                or (f.stream == stream and f.type == RST_STREAM)
                or f.type == GOAWAY
            )
        )
        out: dict[str, str] = {}
        for frame in self.frames:
            if frame.stream == stream and frame.headers is not None:
                out.update(frame.headers)
            if frame.stream == stream and frame.type == RST_STREAM:
                out["rst"] = str(frame.error_code())
        del frames
        return out

    async def goaway(self) -> Frame:
        """The GOAWAY the server sends (fails the test if none comes)."""
        frames = await self.read_until(lambda f: f.type == GOAWAY)
        found = [f for f in frames if f.type == GOAWAY]
        assert found, f"connection closed without GOAWAY: {frames}"
        return found[-1]

    async def until_closed(self) -> list[Frame]:
        """Every frame until the server closes the connection (fails if it does not)."""
        return await self.read_until(lambda f: False)

    def close(self) -> None:
        self.writer.close()


def header_block(frame: Frame) -> bytes:
    """The HPACK block of a HEADERS frame (padding and priority removed)."""
    payload = frame.payload
    if frame.flags & 0x8:  # PADDED
        payload = payload[1 : len(payload) - payload[0]]
    if frame.flags & 0x20:  # PRIORITY
        payload = payload[5:]
    return payload
