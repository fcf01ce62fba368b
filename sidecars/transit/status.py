"""Resources of `/v2/dates`, `/v2/periods`, `/v2/plans`, `/v2/status/time`,
`/v2/status/message`, and `POST /status/feed/refresh` (fetch the static feed again now).

Who may trigger a refresh: it makes every worker fetch and parse the feed, seconds of CPU on
a large one, so it is not public. With `TRANSIT_REFRESH_TOKEN` set it needs
`Authorization: Bearer <token>`; without, only a caller on this machine (loopback) that did not
come through a proxy (a proxy in front makes every caller look local, so a request carrying
`Forwarded` / `X-Forwarded-For` is refused).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from datetime import datetime

import falcon
import falcon.asgi
import msgspec

from .bodies import Body
from .network import Network
from .plans import plan_bodies
from .resources import CACHE_REALTIME, CACHE_VEHICLES, StaticList, _Base, send_raw
from .schemas import json_encoder


class StatusTime(msgspec.Struct):
    """Body of `/v2/status/time` (the real service's fields: Unix seconds, and five minutes
    ago as local `yyyyLLddHHmm`)."""

    now_minus_20_seconds: int
    now_minus_5_minutes: str
    now_minus_90_seconds: int
    now_unix_int: int


class StatusMessage(msgspec.Struct):
    """Body of `/v2/status/message`: what an app shows about the service."""

    body: str
    more_info: str
    style: str
    title: str


class RefreshAnswer(msgspec.Struct):
    """Body of `POST /status/feed/refresh`."""

    status: str
    serving: str | None


class PlanList(StaticList):
    """`/v2/dates`, `/v2/periods`, `/v2/plans` of the served feed (plans.py), `name` saying
    which one."""

    def body(self, net: Network) -> Body:
        """The list, the three made once per operational day of the feed."""
        return net.day_memo(("plans",), lambda: plan_bodies(net))[self.name]


class TimeNow(_Base):
    """`/v2/status/time`: the server's clock, for clients to align their own."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        now = int(self.store.now())
        net = self.store.network
        tz = net.tz if net is not None else None
        five = datetime.fromtimestamp(now - 300, tz).strftime("%Y%m%d%H%M")
        body = StatusTime(
            now_minus_20_seconds=now - 20,
            now_minus_5_minutes=five,
            now_minus_90_seconds=now - 90,
            now_unix_int=now,
        )
        send_raw(resp, falcon.HTTP_200, json_encoder.encode(body), CACHE_VEHICLES)

    on_head = on_get


class Message(_Base):
    """`/v2/status/message`: TRANSIT_STATUS_MESSAGE when set, else what `/health` says."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        configured = self.store.settings.server.status_message
        if configured is not None:
            data = msgspec.json.decode(configured)
            body = StatusMessage(
                body=data.get("body", ""),
                more_info=data.get("more_info", ""),
                style=data["style"],
                title=data["title"],
            )
        else:
            health = self.store.health()
            if health.status == "ok":
                body = StatusMessage(
                    body="", more_info="", style="ok", title="All data is current."
                )
            else:
                body = StatusMessage(
                    body=" ".join(f"{r}." for r in health.reasons),
                    more_info="/health",
                    style="warning" if health.status == "degraded" else "error",
                    title="Some data is not current."
                    if health.status == "degraded"
                    else "The network data is not available yet.",
                )
        send_raw(resp, falcon.HTTP_200, json_encoder.encode(body), CACHE_REALTIME)

    on_head = on_get


class FeedRefresh(_Base):
    """`POST /status/feed/refresh`: fetch the static feed again now, in every worker (202);
    401 without the token, 403 from a non-local caller when no token is configured."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        token = self.store.settings.server.refresh_token
        if token is not None:
            given = req.get_header("Authorization") or ""
            scheme, _, value = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                value.strip().encode(), token.encode()
            ):
                raise falcon.HTTPUnauthorized(
                    description="a refresh needs Authorization: Bearer <TRANSIT_REFRESH_TOKEN>",
                    challenges=['Bearer realm="transit"'],
                )
        elif not _local(req):
            raise falcon.HTTPForbidden(
                description="only local callers may refresh (set TRANSIT_REFRESH_TOKEN to "
                "allow others with the token)"
            )
        self.store.request_refresh()
        net = self.store.network
        answer = RefreshAnswer(status="refresh requested", serving=net.version if net else None)
        send_raw(resp, falcon.HTTP_202, json_encoder.encode(answer), "no-store")
        resp.set_header("Transit-Worker", str(os.getpid()))


def _local(req: falcon.asgi.Request) -> bool:
    """A loopback peer that did not come through a proxy."""
    if req.get_header("Forwarded") or req.get_header("X-Forwarded-For"):
        return False
    try:
        return ipaddress.ip_address(req.remote_addr or "").is_loopback
    except ValueError:
        return False
