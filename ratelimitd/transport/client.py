"""The public ratelimitd client: ShouldRateLimit over gRPC, for asyncio programs.

    from ratelimitd.transport.client import ClientTLS, RateLimitClient, RateLimitError
    from ratelimitd.messages import OVER_LIMIT

    async with RateLimitClient("localhost:8081", timeout=0.25) as client:
        response = await client.should_rate_limit("api", [[("account", "acme")]], hits_addend=1)
        if response.overall_code == OVER_LIMIT:
            ...

`RateLimitClient(target, *, timeout=5.0, tls=None, wait_for_ready=False,
max_reconnect_backoff=5.0)`:

* `target`: a gRPC target, `host:port` or `unix:/path/to.sock` (any server of RLS v3:
  ratelimitd, or envoyproxy/ratelimit itself).
* `timeout`: the deadline of every call, in seconds (None: no deadline); each call may
  give its own.
* `tls`: `ClientTLS(ca_file=..., cert_file=..., key_file=..., server_name=...)`; with a
  certificate and key the client presents them (mTLS). The files are read when the channel
  opens. None: plaintext.
* reconnect: the channel is opened on first use, in the running event loop (a client used
  from another loop, e.g. after a fork or in a new `asyncio.run`, opens a new channel there),
  and reconnects by itself when the server goes away, backing off up to
  `max_reconnect_backoff` seconds between attempts. While it is disconnected a call fails at
  once with UNAVAILABLE, unless `wait_for_ready` makes calls wait (within their deadline)
  for the connection to come back.

Calls:

* `await should_rate_limit(domain, descriptors, hits_addend=0, *, timeout=..., metadata=())`
  -> `messages.Response`; a descriptor is a `messages.Descriptor` or its `(key, value)`
  entries. A status's `rule` is a `protocodec.Limit` (requests_per_unit, unit, name) when
  the server sent a current limit.
* `await should_rate_limit_bytes(request, *, timeout=..., metadata=())` -> bytes: the
  raw-bytes codec, serialized RateLimitRequest in, serialized RateLimitResponse out (no
  protobuf objects on the way: the channel has no serializers).
* Any gRPC failure raises `RateLimitError` with its `code` (`grpc.StatusCode`) and
  `details` (the server's text, e.g. ratelimitd's UNKNOWN
  `rate limit descriptor list must not be empty`). `await close()` (or leaving
  `async with`) closes the channel.

`ratelimitd client ...` (cli.py) is a synchronous use of this client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

from ..messages import Descriptor, Response
from .protocodec import METHOD_PATH, decode_response, encode_request

__all__ = ["DEFAULT_TIMEOUT", "ClientTLS", "RateLimitClient", "RateLimitError"]

DEFAULT_TIMEOUT = 5.0
# Marks "the client's own timeout" in a call's keyword (None means no deadline).
_CLIENT_TIMEOUT: Any = object()


class RateLimitError(Exception):
    """A ShouldRateLimit call that failed: its gRPC status code and details."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


@dataclass(frozen=True, slots=True)
class ClientTLS:
    """TLS for the channel: trust `ca_file` (system roots when empty), present
    `cert_file` + `key_file` when given (mTLS), check `server_name` instead of the target's
    host when set."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials from the files (read now; OSError when one cannot be)."""
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("a client certificate needs both cert_file and key_file")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file),
            private_key=_read(self.key_file),
            certificate_chain=_read(self.cert_file),
        )


def _read(path: str) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


class RateLimitClient:
    """ShouldRateLimit over one gRPC channel (see the module docstring)."""

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        tls: ClientTLS | None = None,
        wait_for_ready: bool = False,
        max_reconnect_backoff: float = 5.0,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.tls = tls
        self.wait_for_ready = wait_for_ready
        # grpc's own default backs off up to 120 s: far too long to notice a restarted server.
        backoff_ms = max(1, round(max_reconnect_backoff * 1000))
        self.options: list[tuple[str, Any]] = [
            ("grpc.initial_reconnect_backoff_ms", min(100, backoff_ms)),
            ("grpc.max_reconnect_backoff_ms", backoff_ms),
        ]
        self._channel: grpc.aio.Channel | None = None
        self._call: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> RateLimitClient:
        await self.open()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the channel in the running loop now (calls do it when needed). Raises
        OSError or ValueError when the TLS files cannot be used."""
        loop = asyncio.get_running_loop()
        if self._channel is not None and self._loop is loop:
            return
        # A channel belongs to the loop it was opened in; one of a finished loop is dropped.
        if self.tls is None:
            channel = grpc.aio.insecure_channel(self.target, options=self.options)
        else:
            options = list(self.options)
            if self.tls.server_name:
                options.append(("grpc.ssl_target_name_override", self.tls.server_name))
            channel = grpc.aio.secure_channel(self.target, self.tls.credentials(), options)
        self._channel, self._loop = channel, loop
        # No serializers: bytes in, bytes out (the raw-bytes codec of protocodec).
        self._call = channel.unary_unary(METHOD_PATH, _registered_method=True)

    async def close(self) -> None:
        """Close the channel (a later call opens a new one)."""
        channel, self._channel, self._call = self._channel, None, None
        if channel is not None and self._loop is asyncio.get_running_loop():
            await channel.close()
        self._loop = None

    async def should_rate_limit_bytes(
        self,
        request: bytes,
        *,
        timeout: float | None = _CLIENT_TIMEOUT,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> bytes:
        """One call with a serialized RateLimitRequest; the serialized RateLimitResponse."""
        if self._call is None or self._loop is not asyncio.get_running_loop():
            await self.open()
        try:
            return await self._call(  # type: ignore[no-any-return]
                request,
                timeout=self.timeout if timeout is _CLIENT_TIMEOUT else timeout,
                metadata=tuple(metadata) or None,
                wait_for_ready=self.wait_for_ready,
            )
        except grpc.aio.AioRpcError as exc:
            raise RateLimitError(exc.code(), exc.details() or "") from None

    async def should_rate_limit(
        self,
        domain: str,
        descriptors: Iterable[Sequence[tuple[str, str]] | Descriptor],
        hits_addend: int = 0,
        *,
        timeout: float | None = _CLIENT_TIMEOUT,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> Response:
        """Ask for a decision on `descriptors` of `domain`; the decoded response."""
        data = await self.should_rate_limit_bytes(
            encode_request(domain, descriptors, hits_addend), timeout=timeout, metadata=metadata
        )
        return decode_response(data)
