"""Threshold webhooks end to end: the API under gunicorn (2 workers) on SQLite and on
PostgreSQL, Redis, ratelimitd, and a real receiver that checks every signature.

Exactly one event per threshold per window while requests cross it on both workers at
once; failed deliveries retried until a 2xx, each attempt recorded in SQL; the CLI lists,
shows and resends; a receiver that hangs never holds a request up."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.daemon import DaemonProcess
from support.ready import wait_for
from support.redis_server import RedisServer
from support.sidecar import Gunicorn, usage_database
from support.webhook_receiver import Delivery, WebhookReceiver, always_ok

from sidecars.usage.cli import main
from sidecars.usage.db.events import EventRecord
from sidecars.usage.settings import USAGE_PATH

from .conftest import BACKENDS, postgres_for, start_sidecar
from .usage_helpers import events_of, hammer, provision

SECRET = "whsec_test_0123456789abcdef"
PLANS = """plans:
  free: {limit: 20, window: rolling_30_days, thresholds: [50, 100]}
  startup: {limit: 40, window: billing_cycle, thresholds: [80, 100]}
"""


@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    """One receiver for the module; tests set its policy per account."""
    r = WebhookReceiver(SECRET)
    yield r
    r.close()


@pytest.fixture(scope="module", params=BACKENDS)
def hooked(
    request: pytest.FixtureRequest,
    receiver: WebhookReceiver,
    redis_server: RedisServer,
    daemon: DaemonProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Gunicorn, dict[str, str]]]:
    """The API with webhooks on, 2 workers, on a fresh database of each kind: (the server,
    its USAGE_* settings for the CLI)."""
    tmp = tmp_path_factory.mktemp("hooked")
    plans = tmp / "plans.yaml"
    plans.write_text(PLANS)
    env = {
        "USAGE_REDIS_URL": redis_server.url,
        "USAGE_RATELIMIT_ADDRESS": daemon.grpc_target,
        "USAGE_RATELIMIT_TIMEOUT_SECONDS": "2",
        "USAGE_REDIS_TIMEOUT_SECONDS": "2",
        "USAGE_PLANS_FILE": str(plans),
        "USAGE_WEBHOOK_URL": receiver.url,
        "USAGE_WEBHOOK_SECRET": SECRET,
        "USAGE_WEBHOOK_RETRY_SECONDS": "0.2",
    }
    env.update(usage_database(request.param, tmp, postgres_for(request)))
    sidecar = start_sidecar(env, tmp / "gunicorn.log")
    yield sidecar, env
    sidecar.terminate()


def _delivered(env: dict[str, str], acct: str, n: int) -> list[EventRecord]:
    """The account's events in SQL, once `n` are there and all delivered."""
    events: list[EventRecord] = []

    def done() -> bool:
        events[:] = events_of(env, acct)
        return len(events) >= n and all(e.status == "delivered" for e in events)

    wait_for(done, 30, f"{n} delivered events of {acct}")
    return events


def test_each_threshold_is_notified_once_per_window_across_workers(
    hooked: tuple[Gunicorn, dict[str, str]], receiver: WebhookReceiver
) -> None:
    sidecar, env = hooked
    # startup: 40 per billing cycle, notified at 80 and 100 %; free: 20 per rolling window,
    # at 50 and 100 %.
    plans = {"startup": (40, [80, 100]), "free": (20, [50, 100])}
    kinds = ("startup", "startup", "free", "free")
    accounts = provision(env, *kinds)
    # All accounts at once, 16 requests in flight over fresh connections (both workers):
    # each crossing is seen by several requests on both workers at the same moment.
    answers = hammer(sidecar, [(token, {}) for _, token in accounts for _ in range(50)])
    statuses = [r.status_code for r in answers]
    assert set(statuses) == {200}, statuses  # the usage endpoint: quota-exempt at the limit
    for (acct, _), plan in zip(accounts, kinds, strict=True):
        plan_limit, marks = plans[plan]
        events = _delivered(env, acct, 2)
        assert sorted(e.threshold for e in events) == marks
        assert all(e.attempts == 1 for e in events)
        got = receiver.of(acct)
        assert len(got) == 2, [d.event for d in got]  # once each: delivered on the first try
        assert all(d.signed for d in got)
        by_threshold = {d.event["threshold"]: d for d in got}
        for pct, delivery in by_threshold.items():
            body = delivery.event
            assert body["type"] == "usage.threshold.crossed" and body["account"] == acct
            assert body["limit"] == plan_limit and body["id"].startswith("evt_")
            assert body["usage"] >= -(-plan_limit * pct // 100)
            assert body["window"]["kind"] in ("billing_cycle", "rolling_30_days")
            assert body["window"]["start"] < body["window"]["end"]
            assert delivery.headers["Usage-Event-Id"] == body["id"]
        assert len({d.event["id"] for d in got}) == 2


@pytest.fixture
def operator(
    hooked: tuple[Gunicorn, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Callable[..., Any]:
    """The CLI in this process with the server's USAGE_* settings: its parsed JSON output."""
    for name, value in hooked[1].items():
        monkeypatch.setenv(name, value)

    def run(*argv: str) -> Any:
        status = main(list(argv))
        out, err = capsys.readouterr()
        assert status == 0, err
        return json.loads(out)

    return run


def test_failed_deliveries_are_retried_recorded_and_resent(
    hooked: tuple[Gunicorn, dict[str, str]],
    receiver: WebhookReceiver,
    operator: Callable[..., Any],
) -> None:
    sidecar, env = hooked
    ((acct, token),) = provision(env, "startup")
    # The account's own thresholds replace its plan's.
    shown = operator("accounts", "update", acct, "--thresholds", "100")
    assert shown["thresholds"] == [100] and shown["thresholdsArePlanDefault"] is False
    seen = {"n": 0}

    def flaky(d: Delivery) -> tuple[int, float]:
        if d.event["account"] != acct:
            return always_ok(d)
        seen["n"] += 1
        return (503, 0.0) if seen["n"] <= 2 else (200, 0.0)

    receiver.policy = flaky
    try:
        hammer(sidecar, [(token, {}) for _ in range(40)])
        got = receiver.wait(acct, 3)
    finally:
        receiver.policy = always_ok
    assert [d.answered for d in got] == [503, 503, 200]
    assert len({d.event["id"] for d in got}) == 1 and all(d.signed for d in got)
    event_id = got[0].event["id"]
    (listed,) = _delivered(env, acct, 1)
    assert listed.id == event_id and listed.threshold == 100
    detail = operator("webhooks", "show", event_id)
    assert detail["status"] == "delivered" and detail["attempts"] == 3
    assert [a["statusCode"] for a in detail["deliveryAttempts"]] == [503, 503, 200]
    assert detail["deliveryAttempts"][0]["error"] == "HTTP 503"
    assert detail["payload"] == got[0].event
    resent = operator("webhooks", "resend", event_id)
    assert resent["status"] == "delivered" and resent["attempts"] == 4
    again = receiver.wait(acct, 4)
    assert again[-1].event == got[0].event and again[-1].signed


def test_a_hanging_receiver_never_holds_requests(
    hooked: tuple[Gunicorn, dict[str, str]], receiver: WebhookReceiver
) -> None:
    sidecar, env = hooked
    ((acct, token),) = provision(env, "free")
    release = threading.Event()

    def hang(d: Delivery) -> tuple[int, float]:
        if d.event["account"] == acct:
            release.wait(30)
        return 204, 0.0

    receiver.policy = hang
    try:
        hammer(sidecar, [(token, {}) for _ in range(10)])  # 50 % of 20: an event
        wait_for(lambda: receiver.in_flight >= 1, 30, "the delivery to hang")
        # The delivery is still hanging while the account's requests are all answered.
        statuses = [r.status_code for r in hammer(sidecar, [(token, {}) for _ in range(20)])]
        assert statuses == [200] * 20
        assert receiver.in_flight >= 1 and not receiver.of(acct)
        assert (
            sidecar.get(USAGE_PATH, headers={"Authorization": f"Bearer {token}"}).json()[
                "currentUsage"
            ]
            == 20
        )
    finally:
        release.set()
        receiver.policy = always_ok
    assert len(receiver.wait(acct, 2)) >= 2  # the 50 % and 100 % events, once released
