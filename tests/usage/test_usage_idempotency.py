"""Idempotent metering: a request retried with the same `Idempotency-Key` is served and not
counted again, the key remembered in the same atomic step as the count (Redis), bounded in
size and number per account, for USAGE_IDEMPOTENCY_WINDOW_SECONDS."""

from __future__ import annotations

import random

import httpx
from support import Clock
from support.redis_server import RedisServer
from support.sidecar import Gunicorn

from sidecars.usage.settings import USAGE_PATH

from .usage_helpers import (
    account_with_token,
    bearer,
    current_usage,
    hammer,
    provision,
    serving,
    settings_for,
)

NOW = 1_800_000_000.0


def test_retries_from_two_workers_count_once(
    sidecar: Gunicorn, sidecar_env: dict[str, str]
) -> None:
    ((acct, token),) = provision(sidecar_env, "pro")
    keys = [f"order-{i:04d}-{random.getrandbits(32):08x}" for i in range(1000)]
    # Each request and its retry side by side, 32 in flight on fresh connections: the two
    # copies of a key often reach the two workers at the same moment.
    requests = [(token, {"Idempotency-Key": k}) for k in keys for _ in range(2)]
    answers = hammer(sidecar, requests, concurrency=32)
    for first, second in zip(answers[::2], answers[1::2], strict=True):
        served, other = sorted(
            (first, second), key=lambda r: (r.status_code, "idempotent-replayed" in r.headers)
        )
        assert served.status_code == 200 and "idempotent-replayed" not in served.headers
        if other.status_code == 200:  # the replay: the first answer, byte for byte
            assert other.headers["idempotent-replayed"] == "true"
            assert other.content == served.content
        else:  # it arrived while the first was being answered
            assert other.status_code == 409
            assert other.json()["error"] == "idempotency_request_in_progress"
    # Usage moved by 1,000, not 2,000.
    assert current_usage(sidecar_env, acct) == 1000


async def test_replays_reuse_and_bad_keys(redis_server: RedisServer) -> None:
    settings = settings_for(redis_server.url, quota_exempt_paths=())
    async with serving(settings) as (client, store):
        acct, token = await account_with_token(store, "pro")
        auth = bearer(token)
        first = await client.get(USAGE_PATH, headers={**auth, "Idempotency-Key": "a-1"})
        assert first.status_code == 200 and "idempotent-replayed" not in first.headers
        assert first.json()["currentUsage"] == 1
        again = await client.get(USAGE_PATH, headers={**auth, "Idempotency-Key": "a-1"})
        assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
        assert again.json()["currentUsage"] == 1
        # A key is compared as sent: the quoted form is another key.
        quoted = await client.get(USAGE_PATH, headers={**auth, "Idempotency-Key": '"a-1"'})
        assert quoted.status_code == 200 and "idempotent-replayed" not in quoted.headers
        # A key belongs to one request: another query with it is refused, not free.
        other = await client.get(
            USAGE_PATH, params={"format": "json"}, headers={**auth, "Idempotency-Key": "a-1"}
        )
        assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"
        for bad in ("", "x" * 256):
            refused = await client.get(USAGE_PATH, headers={**auth, "Idempotency-Key": bad})
            assert refused.status_code == 400, bad
            assert "Idempotency-Key" in refused.json()["message"]
        account = await store.account(acct)
        assert account is not None and (await store.usage(account))[1] == 2
        # Another account's identical key is its own.
        _, token2 = await account_with_token(store, "pro")
        mine = await client.get(USAGE_PATH, headers={**bearer(token2), "Idempotency-Key": "a-1"})
        assert mine.status_code == 200 and "idempotent-replayed" not in mine.headers


async def test_a_refunded_request_forgets_its_key(redis_server: RedisServer) -> None:
    async with serving(settings_for(redis_server.url)) as (client, store):
        _, token = await account_with_token(store, "pro")
        key = {**bearer(token), "Idempotency-Key": "k"}
        # Answered with an error, refunded: its retry has not been paid for.
        assert (await client.get("/nowhere", headers=key)).status_code == 404
        retry = await client.get("/nowhere", headers=key)
        assert retry.status_code == 404 and "idempotent-replayed" not in retry.headers
        served = await client.get(USAGE_PATH, headers=key)
        assert served.status_code == 200 and served.json()["currentUsage"] == 1


async def test_keys_expire_are_bounded_per_account_and_replay_at_quota(
    redis_server: RedisServer,
) -> None:
    clock = Clock(NOW)
    settings = settings_for(
        redis_server.url,
        quota_exempt_paths=(),
        idempotency_window_seconds=3600,
        idempotency_max_keys=3,
    )
    async with serving(settings, clock=clock) as (client, store):
        acct, token = await account_with_token(store, "free")  # 5 per window

        async def get(key: str) -> httpx.Response:
            clock.now += 1  # keys are dropped oldest first
            return await client.get(USAGE_PATH, headers={**bearer(token), "Idempotency-Key": key})

        for key in ("a", "b", "c", "d"):  # "a" is the oldest of four: forgotten
            assert (await get(key)).status_code == 200
        assert (await get("d")).headers.get("idempotent-replayed") == "true"
        assert "idempotent-replayed" not in (await get("a")).headers  # counted: 5 of 5
        assert (await get("e")).status_code == 429  # a new request at the quota
        # A retry of a request already paid for is served at the quota.
        replay = await get("a")
        assert replay.status_code == 200 and replay.headers["idempotent-replayed"] == "true"
        clock.now += 3600  # past the key window: "a" is a new request again
        assert (await get("a")).status_code == 429
        members = redis_server.client().zcard(f"usage:idempotency:{acct}:keys")
        assert members <= 3
        # Keys are stored hashed: the raw key is nowhere in Redis.
        stored = redis_server.client().zrange(f"usage:idempotency:{acct}:keys", 0, -1)
        assert all(len(m) == 32 for m in stored)


async def test_window_zero_turns_keys_off(redis_server: RedisServer) -> None:
    settings = settings_for(redis_server.url, idempotency_window_seconds=0)
    async with serving(settings) as (client, store):
        _, token = await account_with_token(store, "pro")
        headers = {**bearer(token), "Idempotency-Key": "same"}
        bodies = [(await client.get(USAGE_PATH, headers=headers)).json() for _ in range(2)]
        assert [b["currentUsage"] for b in bodies] == [1, 2]


async def test_a_replay_past_the_quota_gets_the_first_answer_byte_for_byte(
    redis_server: RedisServer,
) -> None:
    """A key's retries are not served afresh: with the quota used up, 20 replays of the first
    request's key once each got 200 with a fresh body, uncounted, for the whole window."""
    settings = settings_for(redis_server.url, quota_exempt_paths=())
    async with serving(settings) as (client, store):
        acct, token = await account_with_token(store, "free")  # 5 per window
        keyed = {**bearer(token), "Idempotency-Key": "first"}
        first = await client.get(USAGE_PATH, headers=keyed)
        assert first.status_code == 200 and first.json()["currentUsage"] == 1
        for _ in range(4):
            assert (await client.get(USAGE_PATH, headers=bearer(token))).status_code == 200
        over = await client.get(USAGE_PATH, headers=bearer(token))
        assert over.status_code == 429 and over.json()["error"] == "quota_exceeded"
        for _ in range(20):
            replay = await client.get(USAGE_PATH, headers=keyed)
            assert replay.status_code == 200
            assert replay.content == first.content  # currentUsage 1, not a fresh 5
            assert replay.headers["content-type"] == first.headers["content-type"]
            assert replay.headers["cache-control"] == first.headers["cache-control"]
            assert replay.headers["idempotent-replayed"] == "true"
        account = await store.account(acct)
        assert account is not None and (await store.usage(account))[1] == 5


async def test_the_key_names_the_method_path_query_and_body(redis_server: RedisServer) -> None:
    settings = settings_for(redis_server.url, quota_exempt_paths=())
    async with serving(settings) as (client, store):
        _, token = await account_with_token(store, "pro")
        keyed = {**bearer(token), "Idempotency-Key": "k"}
        assert (
            await client.request("GET", USAGE_PATH, headers=keyed, content=b"a")
        ).status_code == 200
        same = await client.request("GET", USAGE_PATH, headers=keyed, content=b"a")
        assert same.headers["idempotent-replayed"] == "true"
        for other in (
            client.request("GET", USAGE_PATH, headers=keyed, content=b"b"),  # another body
            client.request("POST", USAGE_PATH, headers=keyed, content=b"a"),  # another method
            client.request("GET", USAGE_PATH + "?format=json", headers=keyed, content=b"a"),
        ):
            refused = await other
            assert refused.status_code == 422, refused.text
            assert refused.json()["error"] == "idempotency_key_reused"
            assert (
                refused.json()["message"]
                == "This Idempotency-Key was used with a different request."
            )


async def test_a_replay_whose_answer_was_not_kept_is_refused(redis_server: RedisServer) -> None:
    settings = settings_for(redis_server.url, idempotency_max_answer_bytes=10)
    async with serving(settings) as (client, store):
        _, token = await account_with_token(store, "pro")
        keyed = {**bearer(token), "Idempotency-Key": "big"}
        assert (await client.get(USAGE_PATH, headers=keyed)).status_code == 200
        again = await client.get(USAGE_PATH, headers=keyed)
        assert again.status_code == 409 and again.json()["error"] == "idempotency_answer_not_kept"
