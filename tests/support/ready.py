"""Free ports and readiness polling: no literal ports, no fixed sleeps."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Awaitable, Callable

# The ports handed out lately: the kernel may give a just-released ephemeral port again at
# once, and two ports asked for before either is bound (one container publishing two) must
# differ.
_recent: deque[int] = deque(maxlen=512)


def free_port(cluster_bus: bool = False) -> int:
    """A TCP port nothing listens on right now (with `cluster_bus`, port + 10000 is free too).

    Never one handed out lately in this process. Another process may take it before our
    server binds it; `process.start_bound` retries that race with fresh ports.
    """
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port in _recent:
            continue
        if cluster_bus:
            if port + 10000 >= 65536:
                continue
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
        _recent.append(port)
        return port


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on `port`."""
    try:
        with socket.create_connection((host, port), 0.5):
            return True
    except OSError:
        return False


def http_request(
    url: str,
    body: bytes | None = None,
    timeout: float = 5.0,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """(status, body) of one POST of `body`, or GET without one (with `headers`); an HTTP
    error status is an answer, not an exception."""
    req = urllib.request.Request(
        url, data=body, method="POST" if body is not None else "GET", headers=headers or {}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of one GET; an HTTP error status is an answer, not an exception."""
    return http_request(url, timeout=timeout)


def room_in_this_minute(seconds: float) -> None:
    """Sleep into the next minute unless `seconds` of this one are left, so that calls made
    within `seconds` share one fixed per-minute window (a rule's `unit: minute`)."""
    left = 60 - time.time() % 60
    if left < seconds:
        time.sleep(left + 0.05)


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, what: str = "") -> None:
    """Poll until `predicate()` is true; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


async def wait_until(
    predicate: Callable[[], object | Awaitable[object]], timeout: float = 10.0, what: str = ""
) -> None:
    """`wait_for` on the event loop; `predicate` may return an awaitable."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.01)
