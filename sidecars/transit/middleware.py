"""Cross-cutting HTTP behaviour of the real service: CORS, preflight, timing headers."""

from __future__ import annotations

import time

import falcon
import falcon.asgi

PREFLIGHT_HEADERS = {
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
    "Access-Control-Allow-Headers": "Origin, X-Requested-With, Content-Type, Accept",
    "Access-Control-Allow-Credentials": "true",
    "Access-Control-Max-Age": "1728000",
}


class ServiceHeaders:
    """Adds `Access-Control-Allow-Origin: *` and the CMET receive/send timestamps to every
    response, and answers CORS preflights (`OPTIONS`, any path) with 204 like the real proxy."""

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        req.context.received_ms = int(time.time() * 1000)
        if req.method == "OPTIONS":
            resp.status = falcon.HTTP_204
            resp.content_type = "text/plain; charset=utf-8"
            resp.set_headers(PREFLIGHT_HEADERS)
            resp.complete = True

    async def process_response(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        resource: object,
        req_succeeded: bool,
    ) -> None:
        resp.set_header("Access-Control-Allow-Origin", "*")
        received = getattr(req.context, "received_ms", None)
        if received is not None:
            resp.set_header("CMET-Receive-Timestamp", str(received))
        resp.set_header("CMET-Send-Timestamp", str(int(time.time() * 1000)))
