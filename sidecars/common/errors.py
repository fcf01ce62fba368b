"""`ApiError`: the JSON error body of the usage API and of the rate-limit middleware."""

from __future__ import annotations

from typing import Annotated

import falcon
import falcon.asgi
import msgspec
from msgspec import Struct

JSON = "application/json"
_encode = msgspec.json.encode


class ApiError(Struct, omit_defaults=True):
    """Body of every error the usage API and the rate-limit middleware answer."""

    status: Annotated[int, msgspec.Meta(ge=400, le=599, description="The HTTP status code.")]
    error: Annotated[
        str,
        msgspec.Meta(
            description="Machine-readable code: invalid_request, invalid_format, unauthorized, "
            "invalid_token, account_suspended, subscription_not_started, not_found, "
            "method_not_allowed, idempotency_request_in_progress, idempotency_answer_not_kept, "
            "payload_too_large, idempotency_key_reused, "
            "rate_limited, quota_exceeded, too_many_invalid_tokens, "
            "request_header_fields_too_large, store_unavailable, "
            "rate_limiter_unavailable, internal_error."
        ),
    ]
    message: str
    supportedValues: list[str] | None = None


def answer(resp: falcon.asgi.Response, body: ApiError, retry_after: int | None = None) -> None:
    """Complete the response with a JSON error body (never cached)."""
    resp.status = falcon.code_to_http_status(body.status)
    resp.content_type = JSON
    resp.data = _encode(body)
    resp.cache_control = ["no-store"]
    if retry_after is not None:
        resp.set_header("Retry-After", str(max(1, retry_after)))
    resp.complete = True
