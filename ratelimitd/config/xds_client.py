"""The GRPC_XDS_SOTW config provider: an ADS State-of-the-World client on grpc.aio.

One long-lived `StreamAggregatedResources` stream subscribes (wildcard) to
`RateLimitConfig` resources. Each DiscoveryResponse carries every resource, so each one
rebuilds the whole config through `apply` (the same validation and compilation as YAML
files); a good one is ACKed (its version_info and nonce), a bad one NACKed with the
rejection message in error_detail while the last good config keeps serving.

Connection handling, with the reference's settings:

* until a stream has delivered a response, attempts are
  CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL apart, with +-50% jitter (the reference's
  linear-with-jitter retry interval);
* after a stream that delivered responses breaks (management server restart), the next
  attempt waits the XDS_CLIENT_BACKOFF_* backoff (jpillora/backoff's formula, so the
  default factor 0.5 always waits the initial 10 s; the attempt count is never reset, as
  in the reference), then re-subscribes with the last ACKed version_info so a server that
  still has that version need not resend it.

Every attempt dials a fresh channel: a reused channel would keep gRPC's own reconnect
backoff (up to 120 s) after the server comes back.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import ssl
from collections.abc import Awaitable, Callable, Sequence

import grpc

from .. import __version__
from .._proto import base_pb2, discovery_pb2, discovery_pb2_grpc
from ..runtime.tlsfiles import unreadable
from ..settings import XdsSettings
from . import xds
from .ruleset import ConfigSource

log = logging.getLogger("ratelimitd.config.xds")

Pairs = tuple[tuple[str, str], ...]
# Builds a config from sources now; None when applied, else the rejection message.
Apply = Callable[[Callable[[], Sequence[ConfigSource]]], Awaitable[str | None]]

# gRPC metadata keys: lower-case token characters; `grpc-` is reserved for the library.
_METADATA_KEY = re.compile(r"^[0-9a-z_.-]+$")
# google.rpc.Code INVALID_ARGUMENT: a config the server sent that we reject.
_INVALID_ARGUMENT = 3


class XdsSettingsError(ValueError):
    """CONFIG_GRPC_XDS_* settings that cannot make a connection (reported at start-up)."""


def stream_metadata(s: XdsSettings) -> Pairs:
    """CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS as gRPC metadata (keys lower-cased, as Go)."""
    out = []
    for key, value in s.client_additional_headers:
        name = key.lower()
        if not _METADATA_KEY.match(name) or name.startswith("grpc-"):
            raise XdsSettingsError(
                f"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: {key!r} is not a usable gRPC "
                "metadata key (letters, digits, '_', '-', '.'; not grpc-*)"
            )
        if not value.isascii() or not value.isprintable():
            raise XdsSettingsError(
                f"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: the value of {key!r} must be "
                "printable ASCII"
            )
        out.append((name, value))
    return tuple(out)


def channel_options(s: XdsSettings) -> list[tuple[str, str | int]]:
    """grpc channel arguments for XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES and the TLS SAN."""
    options: list[tuple[str, str | int]] = []
    if s.max_msg_size_in_bytes:
        options.append(("grpc.max_receive_message_length", s.max_msg_size_in_bytes))
    if s.server_use_tls and s.server_tls_san:
        # Like Go's tls.Config.ServerName: the name verified in the server's certificate.
        options.append(("grpc.ssl_target_name_override", s.server_tls_san))
    return options


def channel_credentials(s: XdsSettings) -> grpc.ChannelCredentials | None:
    """TLS credentials from the files (read now), or None for plaintext."""
    if not s.server_use_tls:
        return None
    if bool(s.client_tls_cert) != bool(s.client_tls_key):
        raise XdsSettingsError(
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY "
            "must be set together"
        )
    roots = None
    if s.server_tls_cacert:
        # Go adds the CA to the system pool; grpc's root_certificates replaces its
        # defaults, so the system bundle is added back.
        roots = _read("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", s.server_tls_cacert) + _system_roots()
        _parse(
            f"CONFIG_GRPC_XDS_SERVER_TLS_CACERT ({s.server_tls_cacert})",
            lambda c: c.load_verify_locations(s.server_tls_cacert),
        )
    key = chain = None
    if s.client_tls_cert:
        chain = _read("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", s.client_tls_cert)
        key = _read("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", s.client_tls_key)
        _parse(
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT, CONFIG_GRPC_XDS_CLIENT_TLS_KEY "
            f"({s.client_tls_cert}, {s.client_tls_key})",
            lambda c: c.load_cert_chain(s.client_tls_cert, s.client_tls_key),
        )
    return grpc.ssl_channel_credentials(
        root_certificates=roots, private_key=key, certificate_chain=chain
    )


def _read(setting: str, path: str) -> bytes:
    problem = unreadable([(setting, path)])
    if problem:
        raise XdsSettingsError(problem)
    with open(path, "rb") as fh:
        return fh.read()


def _parse(setting: str, load: Callable[[ssl.SSLContext], None]) -> None:
    """Parse the PEM files now, as the reference does at start-up: grpc would only fail
    each connection attempt, and the client would retry forever."""
    try:
        load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    except ssl.SSLError as err:
        raise XdsSettingsError(f"{setting}: not usable PEM: {err.reason or err}") from None


def _system_roots() -> bytes:
    cafile = ssl.get_default_verify_paths().cafile
    if not cafile:
        return b""
    try:
        with open(cafile, "rb") as fh:
            return b"\n" + fh.read()
    except OSError:
        return b""


def backoff_delay(
    attempt: int,
    initial: float,
    maximum: float,
    factor: float,
    jitter: bool,
    rand: Callable[[], float] = random.random,
) -> float:
    """jpillora/backoff's ForAttempt: initial * factor**attempt, jittered, within [initial, max]."""
    lo = initial if initial > 0 else 0.1
    hi = maximum if maximum > 0 else 10.0
    if lo >= hi:
        return hi
    f = factor if factor > 0 else 2.0
    try:
        delay = lo * f**attempt
    except OverflowError:
        return hi
    if jitter:
        delay = rand() * (delay - lo) + lo
    return min(max(delay, lo), hi)


def linear_jitter(interval: float, rand: Callable[[], float] = random.random) -> float:
    """go-grpc-middleware's BackoffLinearWithJitter(interval, 0.5): interval +-50%."""
    return interval * (1 + 0.5 * (rand() * 2 - 1))


class XdsConfigClient:
    """Keeps one ADS stream open (`run`) and feeds every response to `apply`."""

    def __init__(
        self, settings: XdsSettings, apply: Apply, *, rand: Callable[[], float] = random.random
    ) -> None:
        self.settings = settings
        self._apply = apply
        self._rand = rand
        # Validated now so bad settings stop the daemon at start-up with one line.
        self._metadata = stream_metadata(settings)
        self._credentials = channel_credentials(settings)
        self._options = channel_options(settings)
        self._node = base_pb2.Node(
            id=settings.node_id,
            user_agent_name="ratelimitd",
            user_agent_version=__version__,
        )
        for key, value in settings.node_metadata:
            self._node.metadata.fields[key].string_value = value
        self.acked_version = ""  # version_info of the last applied response
        self._received = 0  # responses on the current stream

    def _request(self, nonce: str = "", error: str | None = None) -> discovery_pb2.DiscoveryRequest:
        request = discovery_pb2.DiscoveryRequest(
            version_info=self.acked_version,
            node=self._node,
            type_url=xds.TYPE_URL,
            response_nonce=nonce,
        )
        if error is not None:
            request.error_detail.code = _INVALID_ARGUMENT
            request.error_detail.message = error
        return request

    async def run(self) -> None:
        """Subscribe, apply and answer responses, reconnect; until cancelled."""
        s = self.settings
        broken_streams = 0
        while True:
            self._received = 0
            try:
                reason = await self._stream()
            except grpc.aio.AioRpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}"
            except Exception as exc:  # e.g. a write racing the stream's end: reconnect anyway
                reason = f"{type(exc).__name__}: {exc}"
            if self._received:
                delay = backoff_delay(
                    broken_streams,
                    s.backoff_initial_interval,
                    s.backoff_max_interval,
                    s.backoff_random_factor,
                    s.backoff_jitter,
                    self._rand,
                )
                broken_streams += 1
                log.warning(
                    "xDS stream to %s broke (%s); reconnecting in %.2fs",
                    s.server_url,
                    reason,
                    delay,
                )
            else:
                delay = linear_jitter(s.server_connect_retry_interval, self._rand)
                log.warning(
                    "cannot subscribe to the xDS management server %s (%s); retrying in %.2fs",
                    s.server_url,
                    reason,
                    delay,
                )
            await asyncio.sleep(delay)

    async def _stream(self) -> str:
        """One stream until it ends (counting responses in `_received`); why it ended."""
        url = self.settings.server_url
        if self._credentials is None:
            channel = grpc.aio.insecure_channel(url, options=self._options)
        else:
            channel = grpc.aio.secure_channel(url, self._credentials, options=self._options)
        try:
            stub = discovery_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
            call = stub.StreamAggregatedResources(metadata=self._metadata or None)
            # The first request re-subscribes with the last ACKed version (empty at start).
            await call.write(self._request())
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    code = await call.code()
                    if code == grpc.StatusCode.OK:
                        return "the management server ended the stream"
                    return f"{code.name}: {await call.details()}"
                if self._received == 0:
                    log.info("subscribed to rate limit configs at %s", url)
                self._received += 1
                await call.write(await self._answer(response))
        finally:
            await channel.close()

    async def _answer(
        self, response: discovery_pb2.DiscoveryResponse
    ) -> discovery_pb2.DiscoveryRequest:
        """Apply one response; the ACK or NACK to send back."""
        if response.type_url and response.type_url != xds.TYPE_URL:
            error: str | None = f"unexpected type_url {response.type_url!r}, want {xds.TYPE_URL!r}"
            log.error("NACK of xDS version %r: %s", response.version_info, error)
        else:
            resources = list(response.resources)
            error = await self._apply(lambda: xds.sources(resources))
        if error is None:
            self.acked_version = response.version_info
            log.info("applied xDS config version %r", response.version_info)
            return self._request(response.nonce)
        return self._request(response.nonce, error)
