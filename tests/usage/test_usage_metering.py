"""Metered events on SQLite and PostgreSQL (with the session's Redis): CloudEvents ingestion
de-duplicated by source + id, late events in their own day, declared meters (sum, count, max,
unique_count; hour and day windows; dimensions), the built-in `requests` meter, and
cancellations that recompute the thresholds of a meter with a limit (one webhook per
crossing that still holds)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import Clock
from support.ready import wait_until
from support.redis_server import RedisServer
from support.webhook_receiver import WebhookReceiver

from sidecars.usage.db.events import EventTable
from sidecars.usage.meters import MeterError, load_meters, parse_meters
from sidecars.usage.rollup import Rollup
from sidecars.usage.settings import CANCEL_PATH, EVENTS_PATH, METERS_PATH, Settings
from sidecars.usage.windows import DAY

from .test_usage_rollup import seed
from .usage_helpers import account_with_token, bearer, serving

INGEST = "ingest-token-0123456789"
OPERATOR = {**bearer(INGEST), "Content-Type": "application/cloudevents+json"}
BATCH = {**bearer(INGEST), "Content-Type": "application/cloudevents-batch+json"}
SECRET = "whsec_metering_tests_0123"
# 2027-01-15T12:00:00Z: mid-day, mid-cycle.
NOW = 1_800_014_400.0 - 1_800_014_400.0 % DAY + DAY / 2
METERS = parse_meters(
    """
meters:
  - {slug: tokens, eventType: llm.tokens, valueProperty: $.tokens, aggregation: sum,
     groupBy: {model: $.model}, limits: {pro: 100}}
  - {slug: calls, eventType: llm.tokens, aggregation: count}
  - {slug: biggest, eventType: llm.tokens, valueProperty: $.tokens, aggregation: max}
  - {slug: users, eventType: llm.tokens, valueProperty: $.user, aggregation: unique_count}
"""
)


def iso(ts: float) -> str:
    """An RFC 3339 instant, as the API writes it."""
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def event(acct: str, n: int, tokens: int, at: float | None = None, **data: Any) -> dict[str, Any]:
    """A CloudEvent of `tokens` tokens for model `data['model']` (default gpt-4o)."""
    ce: dict[str, Any] = {
        "specversion": "1.0",
        "id": f"call-{n}",
        "source": "gateway-1",
        "type": "llm.tokens",
        "subject": acct,
        "data": {"model": "gpt-4o", "tokens": tokens, "user": "u1", **data},
    }
    if at is not None:
        ce["time"] = iso(at)
    return ce


def _settings(db_settings: Settings, **overrides: Any) -> Settings:
    return dataclasses.replace(db_settings, ingest_token=INGEST, **overrides)


async def meter(client: httpx.AsyncClient, token: str, slug: str, **params: str) -> dict[str, Any]:
    """A meter query's body (200 asserted)."""
    resp = await client.get(f"{METERS_PATH}/{slug}", params=params, headers=bearer(token))
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


async def test_ingestion_counts_a_replayed_batch_once_and_late_events_in_their_day(
    db_settings: Settings,
) -> None:
    clock = Clock(NOW)
    async with serving(_settings(db_settings), middleware=[], clock=clock, meters=METERS) as (
        client,
        store,
    ):
        acct, token = await account_with_token(store, "pro")
        batch = [
            event(acct, 1, 10),
            event(acct, 2, 5, model="gpt-4o-mini"),
            event(acct, 3, 7, at=NOW - 2 * DAY),  # two days old: its own day
        ]
        first = await client.post(EVENTS_PATH, json=batch, headers=BATCH)
        assert first.status_code == 200, first.text
        assert first.json() == {"accepted": 3, "duplicates": 0}
        again = await client.post(EVENTS_PATH, json=batch, headers=BATCH)
        assert again.json() == {"accepted": 0, "duplicates": 3}
        # One event (structured mode); a replay carrying another value still counts once.
        single = await client.post(EVENTS_PATH, json=event(acct, 4, 3), headers=OPERATOR)
        assert single.json() == {"accepted": 1, "duplicates": 0}
        replay = await client.post(EVENTS_PATH, json=event(acct, 4, 999), headers=OPERATOR)
        assert replay.json() == {"accepted": 0, "duplicates": 1}

        days = await meter(client, token, "tokens", windowSize="day", groupBy="model",
                           **{"from": iso(NOW - 3 * DAY), "to": iso(NOW + 1)})  # fmt: skip
        today, two_days_ago = NOW - NOW % DAY, NOW - NOW % DAY - 2 * DAY
        assert [(r["windowStart"], r["groupBy"], r["value"]) for r in days["data"]] == [
            (iso(two_days_ago), {"model": "gpt-4o"}, 7),
            (iso(today), {"model": "gpt-4o"}, 13),
            (iso(today), {"model": "gpt-4o-mini"}, 5),
        ]
        assert days["windowSize"] == "day" and days["groupBy"] == ["model"]
        total = await meter(client, token, "tokens", **{"from": iso(NOW - 3 * DAY)})
        assert [r["value"] for r in total["data"]] == [25]

        # Refused, each with its reason, and nothing of the batch is stored.
        old = event(acct, 5, 1, at=NOW - 36 * DAY)
        cases: list[tuple[Any, int, str, str]] = [
            ([event(acct, 6, 1), old], 400, "event_too_old", "event 1: time"),
            ([event(acct, 7, 1, at=NOW + 600)], 400, "event_in_future", "future"),
            ([event("nobody-here", 8, 1)], 400, "unknown_subject", "not an account"),
            ([event(acct, 9, "many")], 400, "invalid_event", "must be a number"),
            ([{**event(acct, 10, 1), "specversion": "0.3"}], 400, "invalid_event", "1.0"),
            ([{**event(acct, 11, 1), "time": "2027-01-15T10:00:00"}], 400, "invalid_event",
             "offset"),
            ([{k: v for k, v in event(acct, 12, 1).items() if k != "id"}], 400,
             "invalid_event", "id"),
            ([], 400, "invalid_event", "empty"),
        ]  # fmt: skip
        for body, status, error, message in cases:
            resp = await client.post(EVENTS_PATH, json=body, headers=BATCH)
            assert resp.status_code == status, (body, resp.text)
            assert resp.json()["error"] == error and message in resp.json()["message"], resp.text
        assert (await meter(client, token, "calls", **{"from": iso(NOW - 3 * DAY)}))["data"][0][
            "value"
        ] == 4
        # Only the operator ingests, with JSON.
        anonymous = await client.post(EVENTS_PATH, json=event(acct, 13, 1))
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"] == 'Bearer realm="ingest"'
        customer = await client.post(EVENTS_PATH, json=event(acct, 13, 1), headers=bearer(token))
        assert customer.status_code == 401
        text = await client.post(
            EVENTS_PATH, content=b"x", headers={**bearer(INGEST), "Content-Type": "text/plain"}
        )
        assert text.status_code == 415
        huge = await client.post(EVENTS_PATH, content=b"[" + b" " * (5 << 20) + b"]",
                                 headers=BATCH)  # fmt: skip
        assert huge.status_code == 413 and huge.json()["error"] == "payload_too_large"


async def test_meters_aggregate_in_windows_by_dimension_and_requests_are_one(
    db_settings: Settings, redis_server: RedisServer
) -> None:
    clock = Clock(NOW - 3 * DAY)
    async with serving(_settings(db_settings), middleware=[], clock=clock, meters=METERS) as (
        client,
        store,
    ):
        acct, token = await account_with_token(store, "pro")
        clock.now = NOW
        hour = NOW - NOW % 3600
        batch = [
            event(acct, 1, 10, at=hour - 3600 + 5, user="a"),
            event(acct, 2, 30, at=hour - 3600 + 9, user="b"),
            event(acct, 3, 20, at=hour + 1, user="a", model="o3"),
            event(acct, 4, 5, at=hour + 2, user="a"),
        ]
        assert (await client.post(EVENTS_PATH, json=batch, headers=BATCH)).status_code == 200
        window = {"from": iso(hour - 3600), "to": iso(hour + 3600), "windowSize": "hour"}

        def by_hour(body: dict[str, Any]) -> list[Any]:
            # The values of the two hours, in order (both must be there).
            assert [r["windowStart"] for r in body["data"]] == [iso(hour - 3600), iso(hour)]
            return [r["value"] for r in body["data"]]

        # Each meter's aggregation of the same four events: the previous hour, then this one.
        expected = {"tokens": [40, 25], "calls": [2, 2], "biggest": [30, 20], "users": [2, 1]}
        assert {
            slug: by_hour(await meter(client, token, slug, **window)) for slug in expected
        } == expected
        grouped = await meter(client, token, "tokens", groupBy="model", **window)
        assert [(r["windowStart"], r["groupBy"]["model"], r["value"]) for r in grouped["data"]] == [
            (iso(hour - 3600), "gpt-4o", 40),
            (iso(hour), "gpt-4o", 5),
            (iso(hour), "o3", 20),
        ]
        # The counted requests are the built-in meter `requests`, by day, from the rollup.
        seed(redis_server, store, acct, {-1: 4, 0: 6})
        await Rollup(store).run_once()
        days = {"from": iso(NOW - 2 * DAY), "windowSize": "day"}
        requests = await meter(client, token, "requests", **days)
        assert [r["value"] for r in requests["data"]] == [4, 6]
        listed = (await client.get(METERS_PATH, headers=bearer(token))).json()["meters"]
        assert [m["slug"] for m in listed] == ["requests", "tokens", "calls", "biggest", "users"]
        assert listed[0]["windowSizes"] == ["day"] and listed[1]["limit"] == 100
        assert listed[1]["groupBy"] == ["model"] and listed[2]["limit"] is None
        # The query's refusals.
        for slug, params, message in [
            ("requests", {"windowSize": "hour"}, "has day"),
            ("tokens", {"groupBy": "region"}, "dimensions model"),
            ("tokens", {"windowSize": "minute"}, "windowSize"),
            ("tokens", {"from": "yesterday"}, "date-time with an offset"),
            ("tokens", {"from": iso(NOW), "to": iso(NOW - 1)}, "before"),
            ("tokens", {"windowSize": "hour", "from": iso(NOW - 40 * DAY)}, "at most 744"),
            ("tokens", {"since": "x"}, "Unknown query parameter"),
        ]:
            resp = await client.get(f"{METERS_PATH}/{slug}", params=params, headers=bearer(token))
            assert resp.status_code == 400 and message in resp.json()["message"], resp.text
        paths = (await client.get("/openapi.json")).json()["paths"]
        assert {METERS_PATH, f"{METERS_PATH}/{{slug}}", EVENTS_PATH, CANCEL_PATH} <= set(paths)
        missing = await client.get(f"{METERS_PATH}/nope", headers=bearer(token))
        assert missing.status_code == 404
        assert (await client.get(f"{METERS_PATH}/tokens")).status_code == 401


def test_meters_file_is_checked(tmp_path: Path) -> None:
    with pytest.raises(MeterError, match="cannot read"):
        load_meters(tmp_path / "missing.yaml")
    assert list(load_meters()) == ["requests", "tokens"]  # the shipped file
    for text, message in [
        ("meters: [{slug: requests, eventType: x, aggregation: count}]", "built-in"),
        ("meters: [{slug: t, eventType: x, aggregation: avg}]", "aggregation"),
        ("meters: [{slug: t, eventType: x, aggregation: sum}]", "JSONPath"),
        ("meters: [{slug: t, eventType: x, aggregation: count, valueProperty: $.v}]", "count"),
        ("meters: [{slug: t, eventType: x, aggregation: count, limits: {gold: 1}}]", "gold"),
        ("meters: [{slug: t, eventType: x, aggregation: count, colour: red}]", "takes only"),
        ("meters: [{slug: T, eventType: x, aggregation: count}]", "slug"),
    ]:
        with pytest.raises(MeterError, match=message):
            parse_meters(text)


async def test_cancel_within_a_day_recomputes_thresholds(db_settings: Settings) -> None:
    receiver = WebhookReceiver(SECRET)
    settings = _settings(
        db_settings, webhook_url=receiver.url, webhook_secret=SECRET, webhook_retry_seconds=0.05
    )
    clock = Clock(NOW)
    try:
        async with serving(settings, middleware=[], clock=clock, meters=METERS) as (
            client,
            store,
        ):
            acct, token = await account_with_token(store, "pro")
            await store.update_account(acct, thresholds="50,100")
            notifier = store.crossings
            assert notifier is not None
            notifier.start()  # type: ignore[attr-defined]  # the lifespan's part
            try:
                cancel = {**bearer(INGEST), "Content-Type": "application/json"}
                batch = [event(acct, 1, 40), event(acct, 2, 20), event(acct, 3, 45)]
                assert (await client.post(EVENTS_PATH, json=batch, headers=BATCH)).json()[
                    "accepted"
                ] == 3  # 105 of 100: 50 % and 100 % crossed
                await wait_until(lambda: len(receiver.of(acct)) >= 2, 30, "two webhooks")
                d50, d100 = sorted(receiver.of(acct), key=lambda d: d.event["threshold"])
                assert (d50.event["meter"], d50.event["threshold"]) == ("tokens", 50)
                assert (d100.event["usage"], d100.event["limit"]) == (105, 100)
                # Cancel 20: 85 still holds 50 % (no second webhook), drops 100 %.
                resp = await client.post(
                    CANCEL_PATH, json={"source": "gateway-1", "id": "call-2"}, headers=cancel
                )
                assert resp.status_code == 200, resp.text
                assert resp.json()["subject"] == acct
                again = await client.post(
                    CANCEL_PATH, json={"source": "gateway-1", "id": "call-2"}, headers=cancel
                )
                assert again.json() == resp.json()  # cancelling twice: the same answer
                total = await meter(client, token, "tokens", **{"from": iso(NOW - DAY)})
                assert [r["value"] for r in total["data"]] == [85]
                # A new event takes it to 100 % again: a new crossing, a new webhook.
                await client.post(EVENTS_PATH, json=[event(acct, 4, 15)], headers=BATCH)
                await wait_until(lambda: len(receiver.of(acct)) >= 3, 30, "a third webhook")
                assert sorted(d.event["threshold"] for d in receiver.of(acct)) == [50, 100, 100]
                # Past 24 hours after receipt: refused, and the event stays.
                clock.now = NOW + 24 * 3600 + 1
                late = await client.post(
                    CANCEL_PATH, json={"source": "gateway-1", "id": "call-1"}, headers=cancel
                )
                assert late.status_code == 409 and late.json()["error"] == "cancel_window_passed"
                unknown = await client.post(
                    CANCEL_PATH, json={"source": "gateway-1", "id": "nope"}, headers=cancel
                )
                assert unknown.status_code == 404
                events = await EventTable(store.db).recent(acct)
                assert sorted((e.meter, e.threshold, e.crossing) for e in events) == [
                    ("tokens", 50, 1),
                    ("tokens", 100, 1),
                    ("tokens", 100, 2),
                ]
                assert len(receiver.of(acct)) == 3
            finally:
                await notifier.close()  # type: ignore[attr-defined]
    finally:
        receiver.close()


async def test_a_rolling_window_notifies_a_mark_once_while_it_holds(db_settings: Settings) -> None:
    """As the request quota's: an account that stays above a mark while the window slides
    is not notified again each day; once old days have left it and it climbs back, it is."""
    receiver = WebhookReceiver(SECRET)
    settings = _settings(
        db_settings, webhook_url=receiver.url, webhook_secret=SECRET, webhook_retry_seconds=0.05
    )
    meters = parse_meters(
        "meters: [{slug: tokens, eventType: llm.tokens, valueProperty: $.tokens,"
        " aggregation: sum, limits: {free: 100}}]"
    )
    clock = Clock(NOW)
    try:
        async with serving(settings, middleware=[], clock=clock, meters=meters) as (
            client,
            store,
        ):
            acct, _ = await account_with_token(store, "free")  # rolling_30_days
            await store.update_account(acct, thresholds="50")
            notifier = store.crossings
            assert notifier is not None
            notifier.start()  # type: ignore[attr-defined]  # the lifespan's part
            try:

                async def ingest(n: int, tokens: int) -> None:
                    resp = await client.post(EVENTS_PATH, json=[event(acct, n, tokens)],
                                             headers=BATCH)  # fmt: skip
                    assert resp.json()["accepted"] == 1, resp.text

                await ingest(1, 60)  # 60 of 100: 50 % crossed
                await wait_until(lambda: len(receiver.of(acct)) >= 1, 30, "a webhook")
                clock.now = NOW + DAY  # the window slid a day; still above
                await ingest(2, 1)
                clock.now = NOW + 32 * DAY  # both days left the window: 1 of 100
                await ingest(3, 1)
                await ingest(4, 60)  # 61: climbed back over 50 %
                await wait_until(lambda: len(receiver.of(acct)) >= 2, 30, "a second webhook")
                events = await EventTable(store.db).recent(acct)
                assert sorted(e.crossing for e in events) == [1, 2]
                assert [d.event["usage"] for d in receiver.of(acct)] == [60, 61]
            finally:
                await notifier.close()  # type: ignore[attr-defined]
    finally:
        receiver.close()
