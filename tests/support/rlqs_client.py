"""A StreamRateLimitQuotas client (grpcio, blocking): reports in, responses out, as Envoy's
rate_limit_quota filter would send them, for tests that look at the messages themselves."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grpc

from ratelimitd._proto import ratelimit_strategy_pb2, rlqs_pb2

Reports = rlqs_pb2.RateLimitQuotaUsageReports
Response = rlqs_pb2.RateLimitQuotaResponse
# (bucket, allowed, denied, elapsed seconds or None for no time_elapsed)
Usage = tuple[Mapping[str, str], int, int, float | None]


def reports(domain: str, usages: Sequence[Usage]) -> bytes:
    """A RateLimitQuotaUsageReports, serialised."""
    message = Reports(domain=domain)
    for bucket, allowed, denied, elapsed in usages:
        usage = message.bucket_quota_usages.add()
        usage.bucket_id.bucket.update(bucket)
        usage.num_requests_allowed = allowed
        usage.num_requests_denied = denied
        if elapsed is not None:
            usage.time_elapsed.FromNanoseconds(round(elapsed * 1e9))
    return message.SerializeToString()


def strategy(action: Any) -> tuple[Any, ...]:
    """An action's assignment as (kind, max_tokens, fill seconds) / (blanket rule name,)."""
    s = action.quota_assignment_action.rate_limit_strategy
    if s.HasField("token_bucket"):
        return ("tokens", s.token_bucket.max_tokens, s.token_bucket.fill_interval.seconds)
    return (ratelimit_strategy_pb2.RateLimitStrategy.BlanketRule.Name(s.blanket_rule),)


class QuotaClient:
    """One stream; `send` raw messages, `receive` responses (RpcError once it ended)."""

    def __init__(self, target: str, channel: grpc.Channel | None = None) -> None:
        self.channel = channel or grpc.insecure_channel(target)
        self._outbox: queue.Queue[bytes | None] = queue.Queue()
        self._inbox: queue.Queue[Any] = queue.Queue()
        call = self.channel.stream_stream(
            "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas",
            request_serializer=None,
            response_deserializer=Response.FromString,
        )
        self.call = call(self._messages())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _messages(self) -> Iterator[bytes]:
        while (message := self._outbox.get()) is not None:
            yield message

    def _read(self) -> None:
        try:
            for response in self.call:
                self._inbox.put(response)
            self._inbox.put(None)
        except grpc.RpcError as exc:
            self._inbox.put(exc)

    def send(self, message: bytes) -> None:
        """One raw message."""
        self._outbox.put(message)

    def report(self, domain: str, *usages: Usage) -> None:
        """One RateLimitQuotaUsageReports."""
        self.send(reports(domain, usages))

    def receive(self, timeout: float = 20.0) -> Any:
        """The next response; the RpcError the stream ended with; None for a clean end."""
        item = self._inbox.get(timeout=timeout)
        if isinstance(item, grpc.RpcError):
            raise item
        return item

    def done(self) -> None:
        """The client's end of stream (half-close)."""
        self._outbox.put(None)

    def close(self) -> None:
        """Cancel the call and close the channel."""
        self.call.cancel()
        self._outbox.put(None)
        self.channel.close()
