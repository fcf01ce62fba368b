"""Who is calling: the client address (X-Forwarded-For trusted only from configured proxies)
and the request-size caps, as one middleware both sidecars can install first."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

import falcon
import falcon.asgi

from .errors import ApiError, answer

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """IP addresses and CIDR networks (ValueError names the bad entry)."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{entry.strip()!r} is not an IP address or network") from None
    return tuple(networks)


def _trusted(address: str, proxies: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in proxies)


class ForwardedForError(ValueError):
    """A trusted proxy sent an X-Forwarded-For that is not a list of IP addresses."""


def client_address(peer: str, forwarded_for: str | None, proxies: tuple[Network, ...]) -> str:
    """The client's address: the peer, unless the peer is a trusted proxy; then the last
    X-Forwarded-For entry (right to left) that is not a trusted proxy itself. Entries a
    client could have written (left of an untrusted hop) are never believed."""
    if not forwarded_for or not _trusted(peer, proxies):
        return peer
    hops = [h.strip() for h in forwarded_for.split(",")]
    for hop in reversed(hops):
        try:
            ipaddress.ip_address(hop)
        except ValueError:
            raise ForwardedForError(f"X-Forwarded-For entry {hop[:64]!r} is not an IP") from None
        if not _trusted(hop, proxies):
            return hop
    return hops[0]


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Falcon middleware: header caps (431) and the client address in `req.context.client`.

    Runs before everything else: a request over `max_header_bytes` in total, with more than
    `max_headers` fields or one field over `max_field_bytes` is answered 431
    `request_header_fields_too_large`; a malformed X-Forwarded-For from a trusted proxy 400.
    """

    proxies: tuple[Network, ...] = ()
    max_header_bytes: int = 8192
    max_headers: int = 64
    max_field_bytes: int = 4096

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """Refuse oversized headers; settle the client address."""
        headers = req.scope.get("headers", ())
        total = 0
        for name, value in headers:
            size = len(name) + len(value)
            total += size
            if size > self.max_field_bytes:
                return self._too_large(
                    resp,
                    f"The {name.decode(errors='replace')[:64]} header "
                    f"is over {self.max_field_bytes} bytes.",
                )
        if len(headers) > self.max_headers or total > self.max_header_bytes:
            return self._too_large(
                resp,
                f"Request headers are limited to {self.max_headers} fields and "
                f"{self.max_header_bytes} bytes.",
            )
        try:
            req.context.client = client_address(
                req.remote_addr or "unknown", req.get_header("X-Forwarded-For"), self.proxies
            )
        except ForwardedForError as exc:
            answer(resp, ApiError(400, "invalid_request", str(exc) + "."))
        return None

    def _too_large(self, resp: falcon.asgi.Response, message: str) -> None:
        answer(resp, ApiError(431, "request_header_fields_too_large", message))
