"""A Falcon ASGI middleware that asks ratelimitd for a decision on every request.

The usage API installs it with its Redis-backed accounts (`sidecars.usage.app`), and the
transit API installs the same when TRANSIT_RATE_LIMIT=true. Per request, in
`process_request`, before routing:

1. A bearer token, when the request carries one, is authenticated by the `authenticate`
   callable given (the usage sidecar's accounts). A Bearer header whose token is
   malformed, unknown or revoked is answered 401 right here, so a client with a bad token
   learns it instead of being served as anonymous. Other schemes and no header: anonymous.
2. ShouldRateLimit with ratelimitd's public client
   (`ratelimitd.transport.client.RateLimitClient`: one gRPC channel per process, a short
   deadline, reconnecting by itself) with descriptors
   (domain `domain`, one hit each):
       anonymous:  [("remote_address", <client address>)]
       account:    [("account", <id>)]  and  [("plan", <plan>), ("account", <id>)]
   These are rates (bursts), not usage: nothing ratelimitd counts is billed.
   OVER_LIMIT: 429 `rate_limited` with Retry-After and RateLimit-Limit/-Remaining/-Reset;
   allowed requests carry the RateLimit-* headers of their tightest limit.
   ratelimitd unreachable, too slow or answering UNKNOWN: `failure_mode` "allow" lets the
   request through, "deny" answers 503 `rate_limiter_unavailable` with Retry-After.
3. Quota: for an account, the `admit` callable (the usage sidecar's atomic check-and-count in
   Redis) counts the request against its plan, or refuses it with 429 `quota_exceeded` and
   the Retry-After it computed. Paths in `quota_exempt_paths` are served even at the limit.
   An `Idempotency-Key` header is handed to `admit` with the request it names (method, path,
   query and a digest of the body, which is read here, at most MAX_KEYED_BODY bytes, and
   handed on to the app unchanged): a retry it recognises is not counted and not served
   again: it gets the first answer back byte for byte (status, the app's headers, body),
   with `Idempotent-Replayed: true`, or 409 while there is none (the first request is still
   being answered, or its answer was larger than `idempotent_answer_bytes` and not kept).
   Serving a retry afresh would let one key read fresh answers past the quota.
4. After the app answered (`process_response`): an admitted request answered with a status
   of 400 or more is refunded (`refund`), unless `count_error_responses`: only requests the
   app served count as usage. Requests the middleware refused were never counted. The
   answer of a request counted under an Idempotency-Key (and not refunded) is handed to
   `remember` for its retries.

The account store's own errors stay its own: the exception types it raises when it cannot
answer are handed in (`unavailable=`) and answered 503 `store_unavailable` with Retry-After.
The authenticated principal is left in `req.context.principal` for the resources.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Protocol, TypeVar

import falcon
import falcon.asgi
import msgspec
from falcon.asgi.stream import BoundedStream

from ratelimitd.messages import OK, OVER_LIMIT, Response
from ratelimitd.transport.client import RateLimitClient, RateLimitError

from .errors import ApiError, answer
from .outage import Outage

log = logging.getLogger(__name__)
T = TypeVar("T")
RECONNECT_BACKOFF = 0.5  # seconds, the most the gRPC channel waits between reconnects
# The largest body of a request carrying an Idempotency-Key: it is read whole to be part of
# the key's fingerprint.
MAX_KEYED_BODY = 1 << 20
# Headers a replay does not take from the stored answer: the middleware sets them per
# request (the limits now, the replay mark), or the server does.
_NOT_REPLAYED = frozenset(
    {
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "retry-after",
        "idempotent-replayed",
        "content-length",
        "transfer-encoding",
        "connection",
    }
)
# A stored answer: (status, headers, body); status 0 marks one not kept (streamed, or
# larger than the bound).
_Stored = tuple[int, list[tuple[str, str]], bytes]
_encode_answer = msgspec.msgpack.Encoder()
_decode_answer = msgspec.msgpack.Decoder(_Stored)


class Principal(Protocol):
    """Who a token belongs to: what the descriptors are made of."""

    @property
    def id(self) -> str: ...

    @property
    def plan(self) -> str: ...


# Token -> principal, or None for an unknown/revoked token; raises on an unavailable store.
Authenticate = Callable[[str], Awaitable[Principal | None]]


class Admission(Protocol):
    """What `admit` answers for one request of an account."""

    @property
    def admitted(self) -> bool: ...

    @property
    def limit(self) -> int: ...

    @property
    def retry_after(self) -> int: ...

    @property
    def replayed(self) -> bool: ...

    @property
    def answer(self) -> bytes | None:
        """A replay's first answer, as `remember` was given it (None: none stored yet)."""


@dataclass(frozen=True, slots=True)
class IdempotencyKey:
    """A request's `Idempotency-Key` header and the request it names (method, path, query,
    the SHA-256 of its body)."""

    key: str
    request: str


# (principal, quota-exempt path, Idempotency-Key or None) -> the admission; raises
# AccessDenied or a store error.
Admit = Callable[[Any, bool, IdempotencyKey | None], Awaitable[Admission]]
# Takes back what an admission counted.
Refund = Callable[[Any], Awaitable[None]]
# Keeps the answer (packed) of a request an admission counted under an Idempotency-Key.
Remember = Callable[[Any, bytes], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    """How the middleware asks ratelimitd and enforces quotas."""

    address: str  # host:port of ratelimitd's gRPC listener; "" asks no one (auth and quota only)
    domain: str = "api"
    timeout_seconds: float = 0.25
    failure_mode: str = "allow"  # or "deny"
    quota_exempt_paths: frozenset[str] = frozenset()
    exempt_paths: frozenset[str] = frozenset()
    retry_after_seconds: int = 5  # when the account store is unavailable
    count_error_responses: bool = False  # True: admitted requests count whatever the answer
    invalid_token_limit: int = 20  # invalid-token attempts per client address and window
    # The largest answer body kept for the retries of an Idempotency-Key (larger: 409).
    idempotent_answer_bytes: int = 16384


class AccessDenied(Exception):
    """Raised by `authenticate` or `admit` for a request its store refuses: a valid token
    whose holder may not be served now (403, e.g. a suspended account), or another client
    error of the account's request (`status`, e.g. a malformed Idempotency-Key)."""

    def __init__(self, error: str, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.error = error
        self.message = message
        self.status = status


def refused(resp: falcon.asgi.Response, denied: AccessDenied) -> None:
    """Answer the refusal's status with its code."""
    answer(resp, ApiError(denied.status, denied.error, denied.message))


class AuthFailure(Exception):
    """A request that must be answered 401; `token_given` decides the challenge."""

    def __init__(self, token_given: bool) -> None:
        super().__init__("invalid_token" if token_given else "unauthorized")
        self.token_given = token_given


def bearer_token(header: str | None) -> str | None:
    """The token of a `Bearer` Authorization header; "" for a Bearer header with no token.

    None when there is no header or it uses another scheme (the caller is anonymous).
    """
    if not header:
        return None
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = rest.strip()
    # More than one credential after the scheme is malformed; "" signals it to the caller.
    return "" if " " in token else token


async def authenticate_request(req: falcon.asgi.Request, authenticate: Authenticate) -> Any:
    """The principal of a request; raises AuthFailure (401), or what `authenticate` raises."""
    principal = getattr(req.context, "principal", None)
    if principal is not None:
        return principal
    token = bearer_token(req.get_header("Authorization"))
    if token is None:
        raise AuthFailure(token_given=False)
    principal = await authenticate(token) if token else None
    if principal is None:
        raise AuthFailure(token_given=True)
    req.context.principal = principal
    return principal


def unauthorized(resp: falcon.asgi.Response, failure: AuthFailure, realm: str = "api") -> None:
    """Answer 401 with the RFC 6750 challenge. Unknown and revoked tokens look the same."""
    challenge = f'Bearer realm="{realm}"'
    if failure.token_given:
        challenge += ', error="invalid_token", error_description="The access token is invalid"'
        body = ApiError(401, "invalid_token", "The access token is invalid.")
    else:
        body = ApiError(401, "unauthorized", "A bearer token is required.")
    resp.set_header("WWW-Authenticate", challenge)
    answer(resp, body)


@dataclass(eq=False)
class RateLimitMiddleware:
    """Authenticate, enforce the quota, ask ratelimitd; see the module docstring."""

    config: RateLimitConfig
    _: KW_ONLY
    authenticate: Authenticate
    admit: Admit | None = None
    refund: Refund | None = None
    remember: Remember | None = None
    count_invalid_token: Callable[[str], Awaitable[tuple[int, int]]] | None = None
    # What `authenticate` / `quota` raise when their store cannot answer: 503, not 500.
    unavailable: tuple[type[Exception], ...] = ()
    realm: str = "api"

    def __post_init__(self) -> None:
        config = self.config
        # client address -> monotonic time its invalid-token block ends (this worker's view)
        self._blocked: dict[str, float] = {}
        # Reconnect backoff capped at RECONNECT_BACKOFF: a restarted ratelimitd is used again
        # within a second (gRPC's jitter adds up to 20 %).
        self.client = (
            RateLimitClient(
                config.address,
                timeout=config.timeout_seconds,
                max_reconnect_backoff=RECONNECT_BACKOFF,
            )
            if config.address
            else None
        )
        consequence = (
            "answering 503 rate_limiter_unavailable (failure mode deny)"
            if config.failure_mode == "deny"
            else "serving without rate limits, quotas still counted (failure mode allow)"
        )
        self.outage = Outage(f"ratelimitd at {config.address}", consequence)
        self._deny = config.failure_mode == "deny"

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """Decide the request; complete `resp` when it is refused."""
        # Preflights carry no credentials and health probes must not be limited.
        if req.method == "OPTIONS" or req.path in self.config.exempt_paths:
            return
        principal = None
        client = getattr(req.context, "client", None) or req.remote_addr or "unknown"
        if bearer_token(req.get_header("Authorization")) is not None:
            blocked_for = self._blocked_for(client)
            if blocked_for:
                self._too_many_invalid(resp, blocked_for)
                return
            try:
                principal = await self._ask(resp, authenticate_request(req, self.authenticate))
            except AuthFailure as failure:
                await self._invalid_token(resp, failure, client)
                return
            if principal is None:
                return
        if principal is not None:
            descriptors: tuple[tuple[tuple[str, str], ...], ...] = (
                (("account", principal.id),),
                (("plan", principal.plan), ("account", principal.id)),
            )
        else:
            descriptors = ((("remote_address", client),),)
        if self.client is not None:
            decision = await self._decide(self.client, descriptors)
            if decision is None or decision.overall_code not in (OK, OVER_LIMIT):
                if self._deny:
                    message = "The rate limiter is unavailable; retry shortly."
                    answer(resp, ApiError(503, "rate_limiter_unavailable", message), 1)
                    return
            else:
                over = self._headers(resp, decision)
                if over is not None:
                    message = f"Too many requests; retry in {over} s."
                    answer(resp, ApiError(429, "rate_limited", message), retry_after=over)
                    return
        if principal is not None and self.admit is not None:
            await self._admit(req, resp, principal)

    def _blocked_for(self, client: str) -> int:
        until = self._blocked.get(client)
        if until is None:
            return 0
        left = until - time.monotonic()
        if left <= 0:
            del self._blocked[client]
            return 0
        return int(left) + 1

    async def _invalid_token(
        self, resp: falcon.asgi.Response, failure: AuthFailure, client: str
    ) -> None:
        """401, or 429 once the address is over its invalid-token attempts."""
        if self.count_invalid_token is not None:
            try:
                attempts, ttl = await self.count_invalid_token(client)
            except self.unavailable:
                attempts, ttl = 0, 0  # the counter is down: answer as usual
            if attempts > self.config.invalid_token_limit:
                if len(self._blocked) > 100_000:
                    self._blocked.clear()
                self._blocked[client] = time.monotonic() + ttl
                self._too_many_invalid(resp, ttl)
                return
        unauthorized(resp, failure, self.realm)

    def _too_many_invalid(self, resp: falcon.asgi.Response, wait: int) -> None:
        message = f"Too many invalid tokens from this address; retry in {wait} s."
        answer(resp, ApiError(429, "too_many_invalid_tokens", message), retry_after=wait)

    async def _admit(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, principal: Any
    ) -> None:
        """Count the request against the quota, or refuse it (429 quota_exceeded)."""
        assert self.admit is not None
        exempt = req.path in self.config.quota_exempt_paths
        key = req.get_header("Idempotency-Key")
        retry = None
        if key is not None:
            body = await _keyed_body(req, resp)
            if body is None:
                return
            digest = hashlib.sha256(body).hexdigest()
            retry = IdempotencyKey(key, f"{req.method} {req.path}?{req.query_string} {digest}")
        admission = await self._ask(resp, self.admit(principal, exempt, retry))
        if admission is None:
            return
        if not admission.admitted:
            limit = admission.limit
            message = f"The plan's quota of {limit} requests in this window is used up."
            answer(resp, ApiError(429, "quota_exceeded", message), admission.retry_after)
            return
        if admission.replayed:
            _replay(resp, admission.answer)
            return
        req.context.admission = admission
        req.context.keyed = retry is not None

    async def process_response(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        resource: object,
        req_succeeded: bool,
    ) -> None:
        """Refund an admitted request the app answered with an error, keep the answer of one
        counted under an Idempotency-Key (see the module doc)."""
        admission = getattr(req.context, "admission", None)
        if admission is None:
            return
        if (
            resp.status_code >= 400
            and self.refund is not None
            and not self.config.count_error_responses
        ):
            try:
                await self.refund(admission)
            except self.unavailable as exc:
                log.warning("refund of an error response not recorded: %s", exc)
            return
        if self.remember is not None and getattr(req.context, "keyed", False):
            stored = await _stored(resp, self.config.idempotent_answer_bytes)
            try:
                await self.remember(admission, stored)
            except self.unavailable as exc:
                log.warning("answer of an Idempotency-Key request not kept: %s", exc)

    async def _decide(
        self, client: RateLimitClient, descriptors: Iterable[Sequence[tuple[str, str]]]
    ) -> Response | None:
        """The decision for one hit, or None when ratelimitd cannot give one in time."""
        try:
            decision = await client.should_rate_limit(self.config.domain, descriptors, 1)
        except RateLimitError as exc:
            self.outage.failed(exc.code.name)  # logged once per outage, not per request
            return None
        self.outage.answered()
        return decision

    async def probe(self) -> bool | None:
        """Whether ratelimitd answers now (None: none configured), for /health: a decision on a
        descriptor no rule matches, so nothing is counted."""
        if self.client is None:
            return None
        try:
            await self.client.should_rate_limit(self.config.domain, [(("health_probe", "1"),)], 1)
        except RateLimitError as exc:
            self.outage.failed(exc.code.name)
            return False
        self.outage.answered()
        return True

    def _headers(self, resp: falcon.asgi.Response, decision: Response) -> int | None:
        """Set RateLimit-* of the tightest limit; the seconds to wait when over a limit."""
        tightest = None
        wait = None
        for status in decision.statuses:
            if status.rule is None:
                continue
            if status.code == OVER_LIMIT:
                reset = max(1, status.duration_until_reset)
                wait = reset if wait is None else max(wait, reset)
                if tightest is None or tightest.code != OVER_LIMIT:
                    tightest = status
            elif tightest is None or (
                tightest.code != OVER_LIMIT and status.limit_remaining < tightest.limit_remaining
            ):
                tightest = status
        if tightest is not None:
            resp.set_header("RateLimit-Limit", str(tightest.rule.requests_per_unit))
            resp.set_header("RateLimit-Remaining", str(tightest.limit_remaining))
            resp.set_header("RateLimit-Reset", str(tightest.duration_until_reset))
        return wait

    async def _ask(self, resp: falcon.asgi.Response, question: Awaitable[T]) -> T | None:
        """The account store's answer, or None once `resp` is answered: the status of its
        refusal (AccessDenied), or 503 when it cannot answer."""
        try:
            return await question
        except AccessDenied as denied:
            refused(resp, denied)
        except self.unavailable:
            self._store_unavailable(resp)
        return None

    def _store_unavailable(self, resp: falcon.asgi.Response) -> None:
        message = "The account store is unavailable; retry shortly."
        answer(resp, ApiError(503, "store_unavailable", message), self.config.retry_after_seconds)

    async def process_shutdown(self, scope: dict, event: dict) -> None:
        """Close the client's gRPC channel."""
        if self.client is not None:
            await self.client.close()


async def _keyed_body(req: falcon.asgi.Request, resp: falcon.asgi.Response) -> bytes | None:
    """The body of a request carrying an Idempotency-Key, read whole and given back to the
    app to read as if it were not; None once `resp` is answered 413 (too large)."""
    if (req.content_length or 0) <= MAX_KEYED_BODY:
        body = await req.stream.read(MAX_KEYED_BODY + 1)
        if len(body) <= MAX_KEYED_BODY:
            event = {"type": "http.request", "body": body, "more_body": False}
            req._stream = BoundedStream(_no_more, first_event=event, content_length=len(body))
            return body
    message = f"A request with an Idempotency-Key may have at most {MAX_KEYED_BODY} bytes of body."
    answer(resp, ApiError(413, "payload_too_large", message))
    return None


async def _no_more() -> dict[str, Any]:
    """The ASGI receive of a body already read whole: nothing more comes."""
    return {"type": "http.request", "body": b"", "more_body": False}


async def _stored(resp: falcon.asgi.Response, most: int) -> bytes:
    """The answer as a replay gets it back: status, the app's headers, the body; a marker
    when the body is streamed or larger than `most` bytes (not kept)."""
    body = await resp.render_body()
    if body is None or len(body) > most:
        return _encode_answer.encode((0, [], b""))
    headers = [(k, v) for k, v in resp.headers.items() if k.lower() not in _NOT_REPLAYED]
    if resp.content_type is not None and "content-type" not in (k.lower() for k, _ in headers):
        headers.append(("content-type", resp.content_type))
    return _encode_answer.encode((resp.status_code, headers, body))


def _replay(resp: falcon.asgi.Response, stored: bytes | None) -> None:
    """Answer a replay with the first answer, or 409 when there is none to give."""
    if stored is None:
        message = "The first request with this Idempotency-Key is still being answered."
        answer(resp, ApiError(409, "idempotency_request_in_progress", message), 1)
        return
    status, headers, body = _decode_answer.decode(stored)
    if not status:
        message = (
            "The request with this Idempotency-Key was answered, and its answer was not kept "
            "for retries (streamed, or too large); use a new key for a new request."
        )
        answer(resp, ApiError(409, "idempotency_answer_not_kept", message))
        return
    resp.status = falcon.code_to_http_status(status)
    for name, value in headers:
        resp.set_header(name, value)
    resp.data = body
    resp.set_header("Idempotent-Replayed", "true")
    resp.complete = True
