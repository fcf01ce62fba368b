"""Redis scripts: the extension's algorithms (docs/algorithms.md) and the refund of
upstream #1140 (is_negative_hits), and their RESP encoding.

Each script is one atomic decision on one key (declared in KEYS, so Cluster routes it by
that key's slot; nothing of one decision lives in another key, so no hash tag is needed)
with the integer maths of `keys.sliding_window` / `keys.token_bucket`, line for line: the
config keeps every product below 2**50 (`config.ruleset.MAX_TICK_PRODUCT`), so Lua's
doubles compute exactly what the compiled and the pure twins compute. The time is the
limiter's (ARGV), like the fixed window's key: one clock decides, and a test can drive it.

Sent as EVALSHA; a server that does not know the script (restarted, flushed, failed over)
answers NOSCRIPT and the backend sends the same call once more as EVAL, which loads it.
Numbers are written back with `%.0f` so that no digit is lost to Lua's `%.14g`.
"""

from __future__ import annotations

import hashlib

from ...config.windows import SLIDING_WINDOW, TOKEN_BUCKET
from ..base import Op
from .resp import bulk_int

# ARGV: now, window (ticks), limit, hits, tick (ms). Returns {level after, ticks until reset};
# the state is written only when hits are admitted (hits 0: a check that counts nothing).
SLIDING_WINDOW_LUA = """
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local hits = tonumber(ARGV[4])
local s = redis.call('HMGET', KEYS[1], 'w', 'c', 'p')
local w = tonumber(s[1]) or 0
local c = tonumber(s[2]) or 0
local p = tonumber(s[3]) or 0
local t0 = now
local start = now - now % window
if w < start then
  if w == start - window then p = c else p = 0 end
  c = 0
  w = start
elseif w > start then
  now = w
  start = w
end
local left = start + window - now
local pe = p
if pe > limit then pe = limit end
local after = math.floor((pe * left + window - 1) / window) + c + hits
if after <= limit then
  c = c + hits
  if hits > 0 then
    redis.call('HSET', KEYS[1], 'w', string.format('%.0f', w), 'c', string.format('%.0f', c),
      'p', string.format('%.0f', p))
    local ttl = (w + 2 * window - t0) * tonumber(ARGV[5])
    if ttl < 1 then ttl = 1 end
    redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ttl))
  end
  if c > 0 then return {after, left + window} end
  return {after, left}
end
local room = limit - c - hits
if room >= 0 then
  return {after, left - math.floor(room * window / pe)}
end
if hits > limit then return {after, left + window} end
local ce = c
if ce > limit then ce = limit end
if ce == 0 then return {after, left} end
return {after, left + window - math.floor((limit - hits) * window / ce)}
"""

TOKEN_BUCKET_LUA = """
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local hits = tonumber(ARGV[4])
if limit <= 0 then
  if hits > 0 then return {hits, window} end
  return {hits, 0}
end
local s = redis.call('HMGET', KEYS[1], 't', 'f')
local t = tonumber(s[1]) or 0
local f = tonumber(s[2]) or 0
local d = t - now
local debt = 0
if d >= 0 then
  if d > window then d = window end
  if f >= limit then f = limit - 1 end
  debt = d * limit + f
end
local after = math.floor((debt + window - 1) / window) + hits
if after <= limit then
  debt = debt + hits * window
  if hits > 0 then
    local t2 = now + math.floor(debt / limit)
    redis.call('HSET', KEYS[1], 't', string.format('%.0f', t2),
      'f', string.format('%.0f', debt % limit))
    redis.call('PEXPIRE', KEYS[1], string.format('%.0f', (t2 - now + 1) * tonumber(ARGV[5])))
  end
  return {after, math.floor((debt + limit - 1) / limit)}
end
if hits <= limit then
  return {after, math.floor((debt - (limit - hits) * window + limit - 1) / limit)}
end
return {after, math.floor((debt + limit - 1) / limit)}
"""


# A refund (is_negative_hits), the reference's DecrementScript (upstream #1140): GET, then
# SET max(0, value - hits) and EXPIRE (ARGV: hits, seconds); an absent counter is left
# absent (0 is returned). One declared key, so Cluster routes it like the INCRBY it undoes.
REFUND_LUA = """
local current = redis.call('GET', KEYS[1])
if current == false then return 0 end
local value = tonumber(current) - tonumber(ARGV[1])
if value < 0 then value = 0 end
redis.call('SET', KEYS[1], string.format('%.0f', value))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return value
"""


def _sha(script: str) -> bytes:
    return hashlib.sha1(script.encode()).hexdigest().encode()


class _Script:
    """One script: the RESP prefixes of its EVALSHA and EVAL calls (one key, `args` args)."""

    __slots__ = ("eval_prefix", "evalsha_prefix", "sha", "source")

    def __init__(self, source: str, args: int = 5) -> None:
        self.source = source
        self.sha = _sha(source)
        body = source.encode()
        n = 4 + args
        self.evalsha_prefix = b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%b\r\n$1\r\n1\r\n" % (n, self.sha)
        self.eval_prefix = b"*%d\r\n$4\r\nEVAL\r\n$%d\r\n%b\r\n$1\r\n1\r\n" % (
            n,
            len(body),
            body,
        )


SCRIPTS = {SLIDING_WINDOW: _Script(SLIDING_WINDOW_LUA), TOKEN_BUCKET: _Script(TOKEN_BUCKET_LUA)}
REFUND = _Script(REFUND_LUA, args=2)


_ARGS = b"%b$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n%b%b"


def call(op: Op, key: bytes, *, peek: bool = False, load: bool = False) -> bytes:
    """The RESP call deciding `op` (EVALSHA; EVAL with `load`); `peek` counts nothing."""
    script = SCRIPTS[op.algorithm]
    now = b"%d" % op.now
    window = b"%d" % (op.seconds * 1000 // op.tick)
    limit = b"%d" % op.limit
    return _ARGS % (
        script.eval_prefix if load else script.evalsha_prefix,
        len(key),
        key,
        len(now),
        now,
        len(window),
        window,
        len(limit),
        limit,
        bulk_int(0 if peek else op.hits),
        bulk_int(op.tick),
    )


def refund(key: bytes, hits: int, seconds: int, *, load: bool = False) -> bytes:
    """The RESP call refunding `hits` of the counter `key` (EVALSHA; EVAL with `load`),
    its TTL set to `seconds`."""
    prefix = REFUND.eval_prefix if load else REFUND.evalsha_prefix
    return b"%b$%d\r\n%b\r\n%b%b" % (prefix, len(key), key, bulk_int(hits), bulk_int(seconds))


def is_noscript(reply: object) -> bool:
    """Is this the server's "I do not know that script" error?"""
    return isinstance(reply, Exception) and str(reply).startswith("NOSCRIPT")
