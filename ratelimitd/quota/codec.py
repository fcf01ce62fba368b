"""RLQS messages in and out: usage reports decoded, bucket actions encoded (protobuf, the
generated upb classes; a few messages per bucket every five seconds need no hand codec)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from .._proto import ratelimit_strategy_pb2, rlqs_pb2

Reports = rlqs_pb2.RateLimitQuotaUsageReports
_Response = rlqs_pb2.RateLimitQuotaResponse
_Strategy = ratelimit_strategy_pb2.RateLimitStrategy

SERVICE_NAME = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"
METHOD_NAME = "StreamRateLimitQuotas"
METHOD_PATH = f"/{SERVICE_NAME}/{METHOD_NAME}"

# Strategies, as the server remembers what it sent (compared to tell an extension from a
# change): ("allow",), ("deny",), or ("tokens", max_tokens, fill_interval_seconds).
ALLOW: tuple[object, ...] = ("allow",)
DENY: tuple[object, ...] = ("deny",)
TOKENS = "tokens"


class ReportError(ValueError):
    """A message that is not a RateLimitQuotaUsageReports."""


@dataclass(slots=True)
class Usage:
    """One BucketQuotaUsage."""

    bucket: dict[str, str]
    elapsed: float
    allowed: int
    denied: int


def decode_reports(data: bytes) -> tuple[str, list[Usage]]:
    """(domain, usages) of one RateLimitQuotaUsageReports; ReportError when undecodable."""
    try:
        message = Reports.FromString(data)
    except DecodeError as exc:
        raise ReportError(f"not a RateLimitQuotaUsageReports: {exc}") from None
    usages = [
        Usage(
            dict(u.bucket_id.bucket),
            u.time_elapsed.seconds + u.time_elapsed.nanos / 1e9,
            u.num_requests_allowed,
            u.num_requests_denied,
        )
        for u in message.bucket_quota_usages
    ]
    return message.domain, usages


@dataclass(slots=True)
class Action:
    """One BucketAction: an assignment (`strategy`, `ttl` seconds, None: no expiry) or, with
    `abandon`, the abandon action. A `reset` token bucket starts full in the Envoy."""

    bucket: dict[str, str]
    strategy: tuple[object, ...] = ALLOW
    ttl: float | None = None
    abandon: bool = False
    reset: bool = False


def encode_actions(actions: Iterable[Action]) -> bytes:
    """A RateLimitQuotaResponse carrying `actions` in order."""
    response = _Response()
    for a in actions:
        if a.reset and a.strategy[0] == TOKENS:
            # Envoy 1.40 gives a token bucket that replaces another the old one's state (an
            # empty bucket stays empty); one that replaces a blanket rule starts full. So a
            # new grant goes out as DENY_ALL then the bucket, applied in order at once.
            _assign(response.bucket_action.add(), Action(a.bucket, DENY, a.ttl))
        _assign(response.bucket_action.add(), a)
    return response.SerializeToString()


def _assign(item: Any, a: Action) -> None:
    """Fill one BucketAction from `a`."""
    item.bucket_id.bucket.update(a.bucket)
    if a.abandon:
        item.abandon_action.SetInParent()
        return
    assignment = item.quota_assignment_action
    if a.ttl is not None:
        assignment.assignment_time_to_live.FromNanoseconds(round(a.ttl * 1e9))
    strategy = assignment.rate_limit_strategy
    kind = a.strategy[0]
    if kind == TOKENS:
        bucket = strategy.token_bucket
        bucket.max_tokens = int(a.strategy[1])  # type: ignore[call-overload]
        bucket.tokens_per_fill.value = 1
        bucket.fill_interval.FromSeconds(int(a.strategy[2]))  # type: ignore[call-overload]
    else:
        strategy.blanket_rule = _Strategy.DENY_ALL if kind == "deny" else _Strategy.ALLOW_ALL
