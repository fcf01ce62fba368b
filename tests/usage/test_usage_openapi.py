"""The OpenAPI document against what the API really sends: every error status (400, 401, 403,
404, 405, 422, 429, 431, 503) documented with the ApiError body and its headers, and every
header an answer carries declared (RateLimit-*, Retry-After, WWW-Authenticate, Allow)."""

from __future__ import annotations

from datetime import date
from typing import Any

import httpx
from support import free_port
from support.daemon import DaemonProcess
from support.redis_server import RedisServer

from sidecars.usage.settings import USAGE_PATH

from .usage_helpers import account_with_token, bearer, daemon_settings, serving, settings_for

WATCHED = {"retry-after", "www-authenticate", "allow", "cache-control"} | {
    f"ratelimit-{h}" for h in ("limit", "remaining", "reset")
}
NAMES = {
    "400": "BadRequest",
    "401": "Unauthorized",
    "403": "Forbidden",
    "404": "NotFound",
    "405": "MethodNotAllowed",
    "422": "UnprocessableContent",
    "429": "TooManyRequests",
    "431": "HeadersTooLarge",
    "503": "ServiceUnavailable",
}


def declared(doc: dict[str, Any], status: int) -> tuple[set[str], set[str]]:
    """(all headers, required headers) the document declares for an error status."""
    response = doc["components"]["responses"][NAMES[str(status)]]
    headers = response["headers"]
    components = doc["components"]["headers"]
    names, required = set(), set()
    for name, ref in headers.items():
        names.add(name.lower())
        target = components[ref["$ref"].rsplit("/", 1)[1]]
        if target.get("required"):
            required.add(name.lower())
    assert response["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ApiError"
    }
    return names, required


async def test_every_error_answer_matches_its_documented_headers(
    redis_server: RedisServer, daemon: DaemonProcess
) -> None:
    settings = daemon_settings(redis_server, daemon, quota_exempt_paths=())
    async with serving(settings) as (client, store):
        doc = (await client.get("/openapi.json")).json()
        assert doc["servers"][0]["url"] == "/"
        _, token = await account_with_token(store, "free")  # quota 5
        _, later = await account_with_token(store, "pro", start=date(2099, 1, 1))
        auth = bearer(token)
        answers: list[httpx.Response] = [
            await client.get(USAGE_PATH, params={"format": "xml"}, headers=auth),  # 400
            await client.get(USAGE_PATH),  # 401
            await client.get(USAGE_PATH, headers=bearer("usk_" + "W" * 43)),  # 401
            await client.get(USAGE_PATH, headers=bearer(later)),  # 403
            await client.get("/nowhere", headers=auth),  # 404
            await client.post(USAGE_PATH, headers=auth),  # 405
            await client.get(USAGE_PATH, headers={"X-Big": "x" * 5000}),  # 431
        ]
        once = {**auth, "Idempotency-Key": "k"}
        await client.get(USAGE_PATH, headers=once)
        answers.append(await client.get(USAGE_PATH + "?format=json", headers=once))  # 422
        for _ in range(6):
            last = await client.get(USAGE_PATH, headers=auth)
        answers.append(last)  # 429 quota_exceeded
    down = settings_for(f"redis://127.0.0.1:{free_port()}/0", counter_failure_mode="deny")
    async with serving(down) as (client, store):
        _, token = await account_with_token(store, "pro")
        answers.append(await client.get(USAGE_PATH, headers=bearer(token)))  # 503
    seen = set()
    for resp in answers:
        names, required = declared(doc, resp.status_code)
        sent = {h for h in resp.headers if h.lower() in WATCHED}
        assert sent <= names, (resp.status_code, sent - names)
        assert required <= sent, (resp.status_code, required - sent)
        seen.add(resp.status_code)
    assert seen == {400, 401, 403, 404, 405, 422, 429, 431, 503}
