"""The `middleware` hook of create_app: request policies run after the CORS/preflight layer and
before every resource, where the usage API's rate limiter sits when it is on."""

from __future__ import annotations

from collections.abc import Callable

import falcon
import falcon.asgi
import falcon.testing

from sidecars.transit.app import Services
from sidecars.transit.store import TransitStore

App = Callable[..., tuple[Services, falcon.testing.TestClient]]


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
    cairns_store: TransitStore, app_for: App
) -> None:
    limiter = DenyAnonymous()
    _, client = app_for(cairns_store, records_dir=None, db=None, middleware=(limiter,))
    denied = client.simulate_get("/v2/lines")
    assert denied.status_code == 429 and denied.json == {"message": "Too Many Requests"}
    assert denied.headers["access-control-allow-origin"] == "*"
    allowed = client.simulate_get("/v2/lines", headers={"Authorization": "Bearer t"})
    assert allowed.status_code == 200 and len(allowed.json) == 22
    assert limiter.seen == ["/v2/lines", "/v2/lines"]
    # Preflights are answered before any policy middleware sees them.
    assert client.simulate_options("/v2/lines").status_code == 204
