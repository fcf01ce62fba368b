"""The main listener's routes: `/json` and `/healthcheck` (any method), as the reference's.

The server they run on is `http.HttpServer`; what they answer is the reference's
(`src/server/server_impl.go`): `/json` decodes a RateLimitRequest in proto3 JSON, decides it
and answers 200, 429 (OVER_LIMIT) or 500 (UNKNOWN) with the response as JSON, 400 for a
request it cannot decode or decide.
"""

from __future__ import annotations

import json

from ..grpcstatus import JSON as ON_JSON
from ..grpcstatus import REFUSED
from ..health import Health
from ..messages import CODE_UNKNOWN, OVER_LIMIT, Refusal, TooLarge
from ..service import RateLimitService, settled
from ..settings import ListenerSettings
from .http import (
    BAD_REQUEST,
    ERROR_HEADERS,
    INTERNAL_ERROR,
    JSON,
    OVERLOADED,
    TEXT_PLAIN,
    Handler,
    HttpRequest,
    Reply,
)
from .jsoncodec import decode_request, encode_response

__all__ = ["main_routes"]

FORBIDDEN: Reply = (403, ERROR_HEADERS, b"domain not served on /json\n")
_HEALTHY: Reply = (200, TEXT_PLAIN, b"OK")
_UNHEALTHY: Reply = (500, (), b"")
# The reply to a request refused instead of decided, by the status `grpcstatus.REFUSED` gives.
_REFUSED: dict[int, Reply] = {400: BAD_REQUEST, 503: OVERLOADED, 500: INTERNAL_ERROR}


def refusal_reply(refusal: Refusal) -> Reply:
    """`/json`'s reply to a refusal."""
    return _REFUSED[REFUSED[refusal.kind][ON_JSON]]


def main_routes(
    service: RateLimitService, health: Health, listeners: ListenerSettings | None = None
) -> dict[str, Handler]:
    """The main listener's routes: `/json` and `/healthcheck` (any method), as the reference.

    Extension: HTTP_JSON_ENABLED=false leaves `/json` out (404 as any unknown path), and
    HTTP_JSON_DOMAINS answers 403 for a domain not listed, before anything is counted.
    """
    decide = service.decide
    listeners = listeners or ListenerSettings()
    domains = frozenset(listeners.json_domains)

    async def healthcheck(request: HttpRequest) -> Reply:
        if b"detail" in request.query:  # extension: the components and breakers, as JSON
            status = 200 if health.healthy() else 500
            return status, JSON, json.dumps(health.detail()).encode()
        return _HEALTHY if health.healthy() else _UNHEALTHY

    if not listeners.json_enabled:
        return {"/healthcheck": healthcheck}

    async def json_endpoint(request: HttpRequest) -> Reply:
        try:
            decoded = decode_request(request.body, service.snapshot.options)
        except TooLarge as exc:
            return refusal_reply(service.answer(exc))  # type: ignore[arg-type]
        except ValueError:
            return BAD_REQUEST
        if domains and decoded.domain not in domains:
            return FORBIDDEN
        response = await settled(decide(decoded))
        if type(response) is Refusal:
            return refusal_reply(response)
        code = response.overall_code
        status = 429 if code == OVER_LIMIT else 500 if code == CODE_UNKNOWN else 200
        return status, JSON, encode_response(response)

    return {"/json": json_endpoint, "/healthcheck": healthcheck}
