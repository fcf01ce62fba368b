"""A webhook receiver for the usage API's threshold events: a real HTTP server on a free port
(in a thread of the test process) that checks every signature on its own, as a customer's
receiver would, records what it got, and answers as the test says.

The signature check is written here independently of `sidecars.usage.webhooks` (it is the
README's snippet), so a mistake on the sending side cannot be mirrored on this side.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .ready import wait_for


def verify_signature(secret: str, header: str, body: bytes, tolerance: int = 300) -> bool:
    """Stripe-style `t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, fresh within
    `tolerance` seconds."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    if "t" not in parts or "v1" not in parts:
        return False
    signed = parts["t"].encode() + b"." + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(parts["t"])) <= tolerance
    return fresh and hmac.compare_digest(expected, parts["v1"])


@dataclass
class Delivery:
    """One POST the receiver got."""

    event: dict[str, Any]
    signed: bool  # the signature verified
    headers: dict[str, str]
    at: float  # time.time() when it arrived
    answered: int = 0  # the status the receiver answered


# What to answer to a delivery: (status, seconds to wait before answering).
Policy = Callable[[Delivery], tuple[int, float]]


def always_ok(_: Delivery) -> tuple[int, float]:
    """Answer 204 at once."""
    return 204, 0.0


class _Server(ThreadingHTTPServer):
    # socketserver's default backlog of 5 refuses connections under a burst of deliveries.
    request_queue_size = 128


@dataclass
class WebhookReceiver:
    """The server; `policy` decides each answer, `deliveries` is what arrived."""

    secret: str
    policy: Policy = always_ok
    deliveries: list[Delivery] = field(default_factory=list)
    in_flight: int = 0  # deliveries the receiver is still answering

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                header = self.headers.get("Usage-Signature", "")
                delivery = Delivery(
                    json.loads(body),
                    verify_signature(receiver.secret, header, body),
                    dict(self.headers.items()),
                    time.time(),
                )
                with receiver._lock:
                    receiver.in_flight += 1
                try:
                    status, delay = receiver.policy(delivery)
                    if delay:
                        time.sleep(delay)
                    delivery.answered = status
                    with receiver._lock:
                        receiver.deliveries.append(delivery)
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                finally:
                    with receiver._lock:
                        receiver.in_flight -= 1

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet test output

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/usage"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def of(self, account: str) -> list[Delivery]:
        """The deliveries of one account's events, in arrival order."""
        with self._lock:
            return [d for d in self.deliveries if d.event.get("account") == account]

    def wait(self, account: str, n: int, timeout: float = 30.0) -> list[Delivery]:
        """Until `n` deliveries of the account's events arrived; they."""
        wait_for(lambda: len(self.of(account)) >= n, timeout, f"{n} deliveries for {account}")
        return self.of(account)

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()
