"""The native transport's bidirectional streams over raw HTTP/2 frames (support.h2raw):
messages split across DATA frames or packed in one, and the streaming calls the core ends
itself (a compressed or unknown payload flag, a partial message at the client's end)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hyperframe.frame import DataFrame, HeadersFrame
from support.daemon import DaemonProcess, daemon_environment, start_daemon, write_config
from support.h2raw import DATA, Raw, grpc_message
from support.rlqs_client import reports

from ratelimitd._proto import rlqs_pb2
from ratelimitd.quota.codec import METHOD_PATH

CONFIG = "domain: rlqs\ndescriptors:\n  - key: name\n    value: open\n"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    env = daemon_environment(
        tmp_path / "runtime", BACKEND_TYPE="memory", LOG_LEVEL="warning", GRPC_TRANSPORT="native"
    )
    write_config(env, "rlqs.yaml", CONFIG)
    d = start_daemon(env, tmp_path)
    yield d
    d.close()


def report(user: str) -> bytes:
    return grpc_message(reports("rlqs", [({"name": "open", "user": user}, 1, 0, 0.0)]))


def open_stream(c: Raw, stream: int) -> None:
    head = c.block(c.headers(_path=METHOD_PATH))
    c.send(HeadersFrame(stream, head, flags=["END_HEADERS"]).serialize())


def responses(c: Raw, stream: int) -> list[list[str]]:
    """The users of each response's actions on `stream` so far (messages may share a DATA
    frame, or span several)."""
    body = b"".join(f.payload for f in c.frames if f.type == DATA and f.stream == stream)
    out = []
    while len(body) >= 5:
        n = int.from_bytes(body[1:5], "big")
        if len(body) < 5 + n:
            break
        message = rlqs_pb2.RateLimitQuotaResponse.FromString(body[5 : 5 + n])
        out.append([a.bucket_id.bucket["user"] for a in message.bucket_action])
        body = body[5 + n :]
    return out


@pytest.fixture
async def raw(daemon: DaemonProcess) -> AsyncIterator[Raw]:
    """A raw HTTP/2 connection to the daemon's gRPC port, closed after the test."""
    c = await Raw.open(daemon.grpc_port)
    yield c
    c.close()


async def test_messages_split_across_frames_and_packed_in_one(raw: Raw) -> None:
    c = raw
    open_stream(c, 1)
    first = report("a")
    c.send(DataFrame(1, first[:3]).serialize())  # the prefix itself split
    c.send(DataFrame(1, first[3:]).serialize())
    await c.read_until(lambda f: f.type == DATA and f.stream == 1 and bool(f.payload))
    c.send(DataFrame(1, report("b") + report("c")).serialize())
    await c.read_until(lambda f: len(responses(c, 1)) == 3)
    assert responses(c, 1) == [["a"], ["b"], ["c"]]
    # The client's end of stream: the call ends OK.
    c.send(DataFrame(1, b"", flags=["END_STREAM"]).serialize())
    end = await c.stream_end(1)
    assert end["grpc-status"] == "0"


@pytest.mark.parametrize(
    ("data", "status", "message"),
    [
        (
            b"\x01" + report("x")[1:],
            "13",
            "grpc: compressed flag set with identity or empty encoding",
        ),
        (b"\x07" + report("x")[1:], "13", "grpc: received unexpected payload format 7"),
        (report("x")[:-2], "13", "unexpected EOF"),
    ],
)
async def test_the_core_ends_malformed_streams(
    raw: Raw, data: bytes, status: str, message: str
) -> None:
    c = raw
    open_stream(c, 1)
    c.send(DataFrame(1, data, flags=["END_STREAM"]).serialize())
    end = await c.stream_end(1)
    assert (end["grpc-status"], end["grpc-message"]) == (status, message)
    # The connection serves on: another stream is answered.
    open_stream(c, 3)
    c.send(DataFrame(3, report("y")).serialize())
    await c.read_until(lambda f: f.type == DATA and f.stream == 3 and bool(f.payload))
    assert responses(c, 3) == [["y"]]
