"""A small real xDS management server (ADS, State of the World) for the xDS provider tests.

It runs a grpc server in the test process on its own port and serves one snapshot
(version + RateLimitConfig resources) the way go-control-plane's snapshot cache does for
the reference's tests: a new subscription gets the snapshot unless it already has that
version, and every `set_snapshot` pushes the new version to every open stream. ACKs and
NACKs are recorded (with the stream's metadata) for the tests to inspect; a NACK is not
answered with a resend. The daemon under test is a separate process.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
from google.protobuf import any_pb2, message

from ratelimitd._proto import discovery_pb2, discovery_pb2_grpc, rls_conf_pb2

TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
Unit = rls_conf_pb2.RateLimitUnit


def rl_config(name: str, domain: str, *descriptors: rls_conf_pb2.RateLimitDescriptor):  # type: ignore[no-untyped-def]
    """A RateLimitConfig resource."""
    return rls_conf_pb2.RateLimitConfig(name=name, domain=domain, descriptors=descriptors)


def rl_descriptor(  # type: ignore[no-untyped-def]
    key: str,
    value: str = "",
    *,
    unit: int | None = None,
    requests_per_unit: int = 0,
    unlimited: bool = False,
    children: Sequence[rls_conf_pb2.RateLimitDescriptor] = (),
    **fields,
):
    """A RateLimitDescriptor; with a policy when `unit` is given or `unlimited`."""
    d = rls_conf_pb2.RateLimitDescriptor(key=key, value=value, descriptors=children, **fields)
    if unit is not None or unlimited:
        d.rate_limit.CopyFrom(
            rls_conf_pb2.RateLimitPolicy(
                unit=unit or 0, requests_per_unit=requests_per_unit, unlimited=unlimited
            )
        )
    return d


@dataclass
class Received:
    """One DiscoveryRequest and the stream it came on."""

    request: discovery_pb2.DiscoveryRequest
    stream: int
    metadata: dict[str, str]

    @property
    def is_nack(self) -> bool:
        """True for a NACK (error_detail set)."""
        return self.request.HasField("error_detail")


@dataclass
class _Stream:
    number: int
    out: queue.Queue[discovery_pb2.DiscoveryResponse | None] = field(default_factory=queue.Queue)
    subscribed: bool = False


class AdsServer:
    """A SotW ADS server on 127.0.0.1:`port` (start/stop/restart it; the state survives)."""

    def __init__(
        self,
        port: int,
        *,
        credentials: grpc.ServerCredentials | None = None,
        node_id: str | None = None,
    ) -> None:
        self.port = port
        self.credentials = credentials
        self.node_id = node_id  # serve only this node (None: any)
        self._cond = threading.Condition()
        self._version: str | None = None
        self._resources: list[any_pb2.Any] = []
        self._streams: dict[int, _Stream] = {}
        self._numbers = itertools.count(1)
        self._nonces = itertools.count(1)
        self.received: list[Received] = []
        self.sent: list[discovery_pb2.DiscoveryResponse] = []
        self._server: grpc.Server | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> AdsServer:
        """Listen (again) on the port."""
        server = grpc.server(ThreadPoolExecutor(max_workers=16), options=[("grpc.so_reuseport", 0)])
        discovery_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(_Servicer(self), server)
        address = f"127.0.0.1:{self.port}"
        if self.credentials is None:
            server.add_insecure_port(address)
        else:
            server.add_secure_port(address, self.credentials)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop listening and break every open stream."""
        if self._server is not None:
            with self._cond:
                for stream in self._streams.values():
                    stream.out.put(None)
                # Forget them now: a handler cut off by the stop may never run its cleanup.
                self._streams.clear()
            self._server.stop(grace=0).wait()
            self._server = None

    # -- the snapshot ---------------------------------------------------------------------
    def set_snapshot(self, version: str, resources: Sequence[message.Message]) -> None:
        """Serve `resources` (RateLimitConfigs, or ready-made Anys) as `version` from now on."""
        packed = []
        for resource in resources:
            if isinstance(resource, any_pb2.Any):
                packed.append(resource)
            else:
                any_msg = any_pb2.Any()
                any_msg.Pack(resource)
                packed.append(any_msg)
        with self._cond:
            self._version, self._resources = version, packed
            for stream in self._streams.values():
                if stream.subscribed:
                    self._push(stream)

    def _push(self, stream: _Stream) -> None:
        response = discovery_pb2.DiscoveryResponse(
            version_info=self._version,
            resources=self._resources,
            type_url=TYPE_URL,
            nonce=str(next(self._nonces)),
        )
        self.sent.append(response)
        stream.out.put(response)
        self._cond.notify_all()

    # -- what the client said -------------------------------------------------------------
    def _wait(self, find: Callable[[], object], timeout: float, what: Callable[[], str]) -> object:
        deadline = time.monotonic() + timeout
        with self._cond:
            while (found := find()) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {what()}")
                self._cond.wait(left)
            return found

    def wait_for(
        self, predicate: Callable[[Received], bool], timeout: float = 20.0, after: int = 0
    ) -> Received:
        """The first request from index `after` on that satisfies `predicate`."""

        def find() -> Received | None:
            return next((r for r in self.received[after:] if predicate(r)), None)

        def what() -> str:
            seen = [(r.request.version_info, r.request.response_nonce) for r in self.received]
            return f"a DiscoveryRequest; received (version, nonce): {seen}"

        return self._wait(find, timeout, what)  # type: ignore[return-value]

    def wait_ack(self, version: str, timeout: float = 20.0) -> Received:
        """The ACK of `version`'s latest response."""
        nonce = self.last_nonce(version, timeout)
        return self.wait_for(lambda r: r.request.response_nonce == nonce and not r.is_nack, timeout)

    def wait_nack(self, version: str, timeout: float = 20.0) -> Received:
        """The NACK of `version`'s latest response."""
        nonce = self.last_nonce(version, timeout)
        return self.wait_for(lambda r: r.request.response_nonce == nonce and r.is_nack, timeout)

    def last_nonce(self, version: str, timeout: float = 20.0) -> str:
        """The nonce of the latest response sent with `version` (waiting for one)."""

        def find() -> str | None:
            sent = (r.nonce for r in reversed(self.sent) if r.version_info == version)
            return next(sent, None)

        return self._wait(find, timeout, lambda: f"version {version!r} to be sent")  # type: ignore[return-value]

    # -- the RPC --------------------------------------------------------------------------
    def _serve(
        self, requests: Iterator[discovery_pb2.DiscoveryRequest], context: grpc.ServicerContext
    ) -> Iterator[discovery_pb2.DiscoveryResponse]:
        metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        with self._cond:
            stream = _Stream(next(self._numbers))
            self._streams[stream.number] = stream
        context.add_callback(lambda: stream.out.put(None))

        def read() -> None:
            try:
                for request in requests:
                    self._on_request(stream, request, metadata)
            except grpc.RpcError:
                pass
            stream.out.put(None)

        threading.Thread(target=read, daemon=True).start()
        try:
            while (response := stream.out.get()) is not None:
                yield response
        finally:
            with self._cond:
                self._streams.pop(stream.number, None)

    def _on_request(
        self, stream: _Stream, request: discovery_pb2.DiscoveryRequest, metadata: dict[str, str]
    ) -> None:
        with self._cond:
            self.received.append(Received(request, stream.number, metadata))
            if not stream.subscribed and request.type_url == TYPE_URL:
                stream.subscribed = True
                wanted = self.node_id is None or request.node.id == self.node_id
                if wanted and self._version is not None and request.version_info != self._version:
                    self._push(stream)
                elif not wanted:
                    stream.subscribed = False  # another node: never served
            self._cond.notify_all()


class _Servicer(discovery_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, owner: AdsServer) -> None:
        self.owner = owner

    def StreamAggregatedResources(self, request_iterator, context):  # type: ignore[no-untyped-def]
        return self.owner._serve(request_iterator, context)
