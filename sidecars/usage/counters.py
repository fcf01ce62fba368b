"""Exact quotas: check-and-count of an account's usage in Redis, one round trip, atomically.

`ADMIT` (a Lua script, so no other client runs between its reads and its write) sums the
window's day buckets and increments today's only when the sum is under the plan's limit, so
across any number of workers and processes an account never gets more than its plan: the
number admitted in a window is exactly min(requests, planLimit). A refund (an admitted
request the app answered with an error, USAGE_COUNT_ERROR_RESPONSES=false) decrements the
bucket it was counted in, never below zero.

Buckets are ratelimitd's `meter_key` layout (`C meter_<domain>_<key>_<id>_<UTC day>`, 35-day
TTL), so the usage read by the endpoint and the CLI is the same sum.

Idempotent metering: a request carrying an `Idempotency-Key` the account used within the key
window is not counted again, and not served again either: it gets the first request's
answer back (stored by `REMEMBER` once the app answered it), so a key cannot serve fresh
answers past the quota. The key is remembered by the same script that counts, so a retry
racing its original on another worker is either the one counted or a replay, never both; a
replay arriving before the first answer is stored gets no answer from the script (the
middleware refuses it, 409). Keys are stored as a 128-bit hash with a fingerprint of the
request they were first used with (method, path, query and body): reusing a key for a
different request is refused (422, as the IETF Idempotency-Key draft says), otherwise one
key would make any number of different requests free. The oldest keys of an account are
dropped past USAGE_IDEMPOTENCY_MAX_KEYS, with their answers.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ratelimitd.config.keys import METER_TTL_SECONDS

from .windows import DAY, Window

# KEYS: the window's day buckets, oldest first, today's last; with an Idempotency-Key, then
#       the account's key set (ZSET member -> expiry, ms), fingerprints (HASH member -> fp)
#       and answers (HASH member -> the first answer, packed by the middleware).
# ARGV: limit, ttl[, member, fingerprint, now ms, key window ms, most keys per account].
# Returns {outcome, used after the call, bucket values...}: outcome COUNTED, REFUSED (the
# bucket values follow, for Retry-After), REPLAYED (the key was seen: not counted; its
# stored answer follows, or nil while there is none) or REUSED (the key was seen with
# another request: refused, not counted).
ADMIT = """
-- unpack() has a stack limit: forget members in chunks.
local function forget(prints, members)
  for i = 1, #members, 1000 do
    redis.call('HDEL', prints, unpack(members, i, math.min(i + 999, #members)))
  end
end
local limit = tonumber(ARGV[1])
local n = #KEYS
local member = ARGV[3]
local seen, keyset, prints, now
local answers
if member then
  n = n - 3
  keyset, prints, answers, now = KEYS[n + 1], KEYS[n + 2], KEYS[n + 3], tonumber(ARGV[5])
  local stale = redis.call('ZRANGEBYSCORE', keyset, '-inf', now)
  forget(prints, stale)
  forget(answers, stale)
  if #stale > 0 then redis.call('ZREMRANGEBYSCORE', keyset, '-inf', now) end
  seen = redis.call('HGET', prints, member)
  if seen and seen ~= ARGV[4] then return {3, 0} end
end
local values = redis.call('MGET', unpack(KEYS, 1, n))
local used = 0
local counts = {}
for i, v in ipairs(values) do
  local c = tonumber(v) or 0
  counts[i] = c
  used = used + c
end
if seen then return {2, used, redis.call('HGET', answers, member)} end
if used >= limit then
  local reply = {0, used}
  for i, c in ipairs(counts) do reply[i + 2] = c end
  return reply
end
local today = KEYS[n]
if redis.call('INCRBY', today, 1) == 1 then
  redis.call('EXPIRE', today, tonumber(ARGV[2]))
end
if member then
  local window = tonumber(ARGV[6])
  redis.call('ZADD', keyset, now + window, member)
  redis.call('HSET', prints, member, ARGV[4])
  local extra = redis.call('ZCARD', keyset) - tonumber(ARGV[7])
  if extra > 0 then
    local oldest = redis.call('ZRANGE', keyset, 0, extra - 1)
    forget(prints, oldest)
    forget(answers, oldest)
    redis.call('ZREMRANGEBYRANK', keyset, 0, extra - 1)
  end
  redis.call('PEXPIRE', keyset, window)
  redis.call('PEXPIRE', prints, window)
end
return {1, used + 1}
"""
REFUSED, COUNTED, REPLAYED, REUSED = 0, 1, 2, 3

# KEYS: the bucket counted in[, the key set, the fingerprints, the answers]; ARGV: [member].
# The key of a refunded request is forgotten too: its retry has not been paid for.
REFUND = """
if ARGV[1] then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
end
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n > 0 then return redis.call('DECRBY', KEYS[1], 1) end
return 0
"""

# KEYS: the fingerprints, the answers; ARGV: member, the packed answer, key window (ms).
# Stored only while the key is still the account's (not refunded, forgotten or expired).
REMEMBER = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
  return 1
end
return 0
"""

TTL = METER_TTL_SECONDS


class Admission(msgspec.Struct, frozen=True):
    """The outcome of one check-and-count."""

    admitted: bool
    used: int  # in the window, after this request when admitted
    limit: int
    retry_after: int = 0  # seconds, when refused
    counted_key: str = ""  # the bucket counted in ("" when nothing was counted)
    buffered: bool = False  # counted in this worker's buffer (Redis was unavailable)
    replayed: bool = False  # an Idempotency-Key seen before: not counted, not served again
    # A replay's first answer as the middleware packed it (None: not stored yet).
    answer: bytes | None = None
    # The key set, fingerprints, answers and member of the request's Idempotency-Key
    # (refunds drop it, `remember` stores its answer).
    idempotency: tuple[str, str, str, str] | None = None


def retry_after(window: Window, counts: Sequence[int], limit: int, now: float) -> int:
    """Seconds until the window has room for one request again, without new usage.

    A billing cycle has room when the next cycle starts. A rolling window slides at 00:00Z,
    dropping its oldest bucket each day: the answer is the first midnight after which what is
    left of today's buckets is under the limit.
    """
    if window.kind != "rolling_30_days" or limit <= 0:
        return max(1, int(window.end - now))
    used = sum(counts)
    for k, oldest in enumerate(counts):
        used -= oldest
        if used < limit:
            return max(1, int(window.end + k * DAY - now))
    return max(1, int(window.end + len(counts) * DAY - now))


class UsageBuffer:
    """Hits admitted while Redis could not count them (USAGE_COUNTER_FAILURE_MODE=allow):
    per worker, bounded (`capacity` hits), flushed as plain increments once Redis answers."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.hits: dict[str, int] = {}  # bucket key -> hits not yet in Redis
        self.total = 0
        self.flushed = 0  # hits written back since start (for the logs and /health)

    def add(self, key: str) -> bool:
        """Buffer one hit; False when the buffer is full (the request must be refused)."""
        if self.total >= self.capacity:
            return False
        self.hits[key] = self.hits.get(key, 0) + 1
        self.total += 1
        return True

    def take_back(self, key: str) -> bool:
        """Refund a buffered hit; False when none is buffered under `key`."""
        n = self.hits.get(key, 0)
        if n <= 0:
            return False
        if n == 1:
            del self.hits[key]
        else:
            self.hits[key] = n - 1
        self.total -= 1
        return True
