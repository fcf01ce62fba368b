"""Cross-cutting HTTP behaviour of the real service: CORS, preflight, timing headers, gzip."""

from __future__ import annotations

import gzip
import time

import falcon
import falcon.asgi

from .bodies import GZIP_MIN_BYTES, accepts_gzip

PREFLIGHT_HEADERS = {
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
    "Access-Control-Allow-Headers": "Origin, X-Requested-With, Content-Type, Accept",
    "Access-Control-Allow-Credentials": "true",
    "Access-Control-Max-Age": "1728000",
}


class ServiceHeaders:
    """Adds `Access-Control-Allow-Origin: *` and the CMET receive/send timestamps to every
    response, answers CORS preflights (`OPTIONS`, any path) with 204 like the real proxy, and
    gzips every JSON body of GZIP_MIN_BYTES or more when the client accepts it (as the real
    proxy does for application/json). Bodies served many times are compressed once by their
    resource (`bodies.Body`) and arrive here already encoded."""

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
        data = resp.data
        if (
            data is not None
            and len(data) >= GZIP_MIN_BYTES
            and (resp.content_type or "").startswith("application/json")
            and resp.get_header("Content-Encoding") is None
        ):
            resp.vary = ["Accept-Encoding"]
            if accepts_gzip(req.get_header("Accept-Encoding")):
                resp.data = gzip.compress(data, compresslevel=5, mtime=0)
                resp.set_header("Content-Encoding", "gzip")
        received = getattr(req.context, "received_ms", None)
        if received is not None:
            resp.set_header("CMET-Receive-Timestamp", str(received))
        resp.set_header("CMET-Send-Timestamp", str(int(time.time() * 1000)))


class KnownParams:
    """Answers 400 to a query parameter the resource does not read, naming the ones it does
    (a misspelt `?line=` would otherwise return every vehicle as if filtered). A resource
    lists what it reads in `params`; one without reads none."""

    async def process_resource(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        resource: object,
        params: dict,
    ) -> None:
        if not req.params or resource is None:
            return
        known = getattr(resource, "params", ())
        unknown = sorted(set(req.params) - set(known))
        if unknown:
            accepted = ", ".join(known) if known else "none"
            raise falcon.HTTPBadRequest(
                description=f"unknown query parameter(s): {', '.join(unknown)} "
                f"(accepted here: {accepted})"
            )
