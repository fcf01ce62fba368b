"""The threshold notifier in process, on SQLite and PostgreSQL: when a crossing is one,
two workers seeing it at once, a dead receiver retried with backoff until the event is given
up, and the signature a receiver checks."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import itertools
import re
import time
from collections.abc import AsyncIterator
from datetime import date
from typing import Any

import msgspec
import pytest
from support import REPO, free_port
from support.ready import wait_until
from support.webhook_receiver import WebhookReceiver

from sidecars.usage.db import open_database
from sidecars.usage.db.events import EventTable
from sidecars.usage.settings import Settings
from sidecars.usage.store import Account, UsageStore
from sidecars.usage.webhooks import (
    MAX_DELAY,
    Crossing,
    Notifier,
    backoff,
    marks,
    signature,
    verify,
)
from sidecars.usage.windows import Window, usage_window

from .usage_helpers import TEST_PLANS, account_with_token, unique

SECRET = "whsec_notifier_tests_0123"
NOW = 1_800_000_000.0


START = date(2026, 1, 1)


def _account(kind: str, thresholds: tuple[int, ...] = (50, 100)) -> Account:
    return Account(unique(), "free", kind, START, None, thresholds=thresholds)


def _window(kind: str) -> Window:
    return usage_window(kind, START, NOW)


def test_marks_round_up_and_signatures_verify() -> None:
    assert marks((80, 100), 5) == [(80, 4), (100, 5)]
    assert marks((50,), 3) == [(50, 2)]  # 1.5 rounds up: the mark is reached, not passed
    body = b'{"id":"evt_1"}'
    header = signature(SECRET, int(NOW), body)
    assert header.startswith(f"t={int(NOW)},v1=")
    expected = hmac.new(SECRET.encode(), f"{int(NOW)}.".encode() + body, hashlib.sha256)
    assert header.endswith(expected.hexdigest())
    assert verify(SECRET, header, body, NOW)
    assert not verify(SECRET, header, body + b" ", NOW)  # tampered body
    assert not verify("another-secret-0123", header, body, NOW)
    assert not verify(SECRET, header, body, NOW + 301)  # replayed after the tolerance
    assert not verify(SECRET, "v1=abc", body, NOW)
    # During a rotation each secret signs: a receiver knowing either one accepts the event.
    rotated = signature(f"new-secret-0123456789 {SECRET}", int(NOW), body)
    assert rotated.count("v1=") == 2
    assert verify(SECRET, rotated, body, NOW)
    assert verify("new-secret-0123456789", rotated, body, NOW)


def test_backoff_doubles_with_jitter_up_to_an_hour() -> None:
    for failures in range(1, 30):
        delay = min(MAX_DELAY, 10 * 2 ** (failures - 1))
        for _ in range(20):
            assert delay / 2 <= backoff(failures, 10) <= delay
    assert len({round(backoff(3, 10), 6) for _ in range(20)}) > 1  # jittered


@pytest.fixture
async def store(db_settings: Settings) -> AsyncIterator[UsageStore]:
    """A store on a fresh database of each kind."""
    s = UsageStore(db_settings, TEST_PLANS)
    yield s
    await s.close()


def _hooked(settings: Settings, url: str, **overrides: object) -> Settings:
    return dataclasses.replace(
        settings,
        webhook_url=url,
        webhook_secret=SECRET,
        webhook_retry_seconds=0.05,
        webhook_timeout_seconds=2.0,
        **overrides,  # type: ignore[arg-type]
    )


async def test_crossings_billing_at_or_above_rolling_only_the_crossing_request(
    store: UsageStore,
) -> None:
    notifier = Notifier(_hooked(store.settings, "http://127.0.0.1:9/"), store.db)
    notifier.start()
    try:
        queue = notifier._queue
        assert queue is not None
        billing = _account("billing_cycle")
        window = _window("billing_cycle")
        notifier.observe(billing, window, 4, 10)  # under 50 %
        assert queue.qsize() == 0
        notifier.observe(billing, window, 7, 10)  # jumped over 50 % (hits flushed late)
        notifier.observe(billing, window, 8, 10)  # already queued in this worker
        assert [c.threshold for c in _drain(queue)] == [50]
        notifier.observe(billing, window, 10, 10)
        assert [c.threshold for c in _drain(queue)] == [100]
        rolling = _account("rolling_30_days")
        rwindow = _window("rolling_30_days")
        # Above the mark without crossing it (the window slid at midnight): nothing.
        notifier.observe(rolling, rwindow, 7, 10)
        assert queue.qsize() == 0
        notifier.observe(rolling, rwindow, 5, 10)  # 4 -> 5: this request crossed 50 %
        (crossing,) = _drain(queue)
        assert (crossing.threshold, crossing.usage, crossing.limit) == (50, 5, 10)
        assert crossing.window == rwindow
        notifier.observe(_account("billing_cycle", ()), window, 10, 10)  # no thresholds
        notifier.observe(billing, window, 0, 0)  # a quota of 0: nothing is ever counted
        assert queue.qsize() == 0
    finally:
        await notifier.close()


def _drain(queue: asyncio.Queue[Crossing]) -> list[Crossing]:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


async def test_two_workers_crossing_at_once_make_one_event(store: UsageStore) -> None:
    receiver = WebhookReceiver(SECRET)
    settings = _hooked(store.settings, receiver.url)
    # Two notifiers on two connections to the database: two workers.
    second_db = open_database(settings)
    workers = [Notifier(settings, store.db), Notifier(settings, second_db)]
    try:
        for n in workers:
            n.start()
        acct, _ = await account_with_token(store, "startup")  # 20 per billing cycle
        account = await store.account(acct)
        assert account is not None and account.thresholds == (80, 100)
        window = store.window(account)
        for n in workers:
            n.observe(account, window, 20, 20)  # both see 100 % (and 80 %: 20 >= 16)
        await wait_until(lambda: len(receiver.of(acct)) >= 2, 20, "two deliveries")
        events = await EventTable(store.db).recent(acct)
        assert sorted(e.threshold for e in events) == [80, 100]
        await wait_until(lambda: _all_delivered(store, acct), 20, "both delivered")
        assert sorted(d.event["threshold"] for d in receiver.of(acct)) == [80, 100]
        assert all(d.signed for d in receiver.of(acct))
    finally:
        for n in workers:
            await n.close()
        await second_db.close()
        receiver.close()


async def _all_delivered(store: UsageStore, acct: str) -> bool:
    events = await EventTable(store.db).recent(acct)
    return bool(events) and all(e.status == "delivered" for e in events)


async def test_a_dead_receiver_is_retried_with_backoff_then_given_up(store: UsageStore) -> None:
    settings = _hooked(
        store.settings, f"http://127.0.0.1:{free_port()}/hook", webhook_retry_for_seconds=1.0
    )
    notifier = Notifier(settings, store.db)
    notifier.start()
    try:
        acct, _ = await account_with_token(store, "free")
        account = await store.account(acct)
        assert account is not None
        account = msgspec.structs.replace(account, thresholds=(100,))
        notifier.observe(account, store.window(account), 5, 5)
        table = EventTable(store.db)

        async def failed() -> bool:
            events = await table.recent(acct)
            return bool(events) and events[0].status == "failed"

        await wait_until(failed, 20, "the event to be given up")
        (event,) = await table.recent(acct)
        attempts = await table.attempts(event.id)
        assert len(attempts) == event.attempts >= 3  # 0.05 s doubling within 1 s
        assert all(a.status_code is None and "Connect" in a.error for a in attempts)
        gaps = [b.at_ms - a.at_ms for a, b in itertools.pairwise(attempts)]
        assert all(g >= 20 for g in gaps)  # at least half the first delay apart
        assert attempts[-1].at_ms <= event.give_up_ms
        # An operator resends it once the receiver is up: a fresh day of retries.
        receiver = WebhookReceiver(SECRET)
        try:
            fixed = Notifier(dataclasses.replace(settings, webhook_url=receiver.url), store.db)
            held = await table.claim(event.id, int(store.clock() * 1000), 10_000, again=True)
            assert held is not None
            attempt = await fixed.attempt(held, again=True)
            await fixed.close()
            assert attempt.status_code == 204 and attempt.attempt == event.attempts + 1
            assert (await table.get(event.id)).status == "delivered"  # type: ignore[union-attr]
            assert receiver.of(acct)[0].signed
        finally:
            receiver.close()
    finally:
        await notifier.close()


def test_the_readme_verification_snippet_accepts_our_signatures() -> None:
    readme = (REPO / "sidecars" / "usage" / "README.md").read_text()
    snippet = re.search(r"```python\n(import hashlib, hmac, time\n.*?)```", readme, re.S)
    assert snippet is not None
    namespace: dict[str, Any] = {}
    exec(snippet.group(1), namespace)  # the documented receiver code, as a customer copies it
    check = namespace["verify"]
    body = b'{"id":"evt_1","type":"usage.threshold.crossed"}'
    now = int(time.time())
    assert check(SECRET, signature(SECRET, now, body), body)
    assert check(SECRET, signature(f"new-secret-0123456789 {SECRET}", now, body), body)
    assert not check(SECRET, signature(SECRET, now, body), body + b"x")
    assert not check(SECRET, signature(SECRET, now - 3600, body), body)
