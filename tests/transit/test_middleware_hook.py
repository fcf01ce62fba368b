"""The `middleware` hook of create_app, where the usage API's rate limiter plugs in."""

from __future__ import annotations

import falcon
import falcon.asgi
import falcon.testing

from sidecars.transit.app import create_app
from sidecars.transit.store import TransitStore


class DenyAnonymous:
    """A stand-in rate limiter: 429 unless the request carries a token."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        self.seen.append(req.path)
        if not req.get_header("Authorization"):
            resp.status = falcon.HTTP_429
            resp.content_type = "application/json; charset=utf-8"
            resp.data = b'{"message":"Too Many Requests"}'
            resp.complete = True


def test_middleware_runs_before_resources_and_keeps_service_headers(
    cairns_store: TransitStore,
) -> None:
    limiter = DenyAnonymous()
    client = falcon.testing.TestClient(
        create_app(cairns_store.settings, store=cairns_store, middleware=[limiter])
    )
    denied = client.simulate_get("/v2/lines")
    assert denied.status_code == 429 and denied.json == {"message": "Too Many Requests"}
    assert denied.headers["access-control-allow-origin"] == "*"
    allowed = client.simulate_get("/v2/lines", headers={"Authorization": "Bearer t"})
    assert allowed.status_code == 200 and len(allowed.json) == 22
    assert limiter.seen == ["/v2/lines", "/v2/lines"]
    # Preflights are answered before any policy middleware sees them.
    assert client.simulate_options("/v2/lines").status_code == 204
