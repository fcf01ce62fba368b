"""Exact quotas: check-and-count of an account's usage in Redis, one round trip, atomically.

`ADMIT` (a Lua script, so no other client runs between its reads and its write) sums the
window's day buckets and increments today's only when the sum is under the plan's limit, so
across any number of workers and processes an account never gets more than its plan: the
number admitted in a window is exactly min(requests, planLimit). A refund (an admitted
request the app answered with an error, USAGE_COUNT_ERROR_RESPONSES=false) decrements the
bucket it was counted in, never below zero.

Buckets are ratelimitd's `meter_key` layout (`C meter_<domain>_<key>_<id>_<UTC day>`, 35-day
TTL), so the usage read by the endpoint and the CLI is the same sum.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ratelimitd.keys import METER_TTL_SECONDS

from .windows import DAY, Window

# KEYS: the window's day buckets, oldest first, today's last. ARGV: limit, ttl.
# Returns {admitted (0/1), used after the call, bucket values...} (values only when refused).
ADMIT = """
local limit = tonumber(ARGV[1])
local values = redis.call('MGET', unpack(KEYS))
local used = 0
local counts = {}
for i, v in ipairs(values) do
  local n = tonumber(v) or 0
  counts[i] = n
  used = used + n
end
if used >= limit then
  local reply = {0, used}
  for i, n in ipairs(counts) do reply[i + 2] = n end
  return reply
end
local today = KEYS[#KEYS]
if redis.call('INCRBY', today, 1) == 1 then
  redis.call('EXPIRE', today, tonumber(ARGV[2]))
end
return {1, used + 1}
"""

REFUND = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n > 0 then return redis.call('DECRBY', KEYS[1], 1) end
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
