"""The small scripts of the rare paths of budgets kept in plain commands
(`backends.redis.claims`): forgetting a budget at its `e`, raising `e`, marking a reused
id contested, settling an id the budget does not hold, taking back a claim that found no
record, and claiming a sweep. Each runs where plain commands would race; the common paths
never run one. Sent as EVALSHA, and as EVAL (which loads it) after NOSCRIPT.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from .resp import command

__all__ = ["CONTEST", "DROP", "FORGET", "ORPHAN", "RAISE", "SCRIPTS", "SWEEP", "Script"]

# KEYS: the records hash. ARGV: now. Delete it if its `e` has passed; reply: the `e` kept
# (0: none, or forgotten).
_FORGET = """
local v = redis.call('HGET', KEYS[1], '~')
local e = 0
if v then e = tonumber(string.sub(v, 1, 20)) end
if e > 0 and e <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 0
end
return e
"""

# KEYS: the records hash. ARGV: e, its `~` value, now. Raise `e` (and the hash's TTL) to
# ARGV[1] if it is later; reply: the `e` now (0: no hash).
_RAISE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local v = redis.call('HGET', KEYS[1], '~')
local e = 0
if v then e = tonumber(string.sub(v, 1, 20)) end
local want = tonumber(ARGV[1])
if want <= e then return e end
redis.call('HSET', KEYS[1], '~', ARGV[2])
redis.call('PEXPIRE', KEYS[1], want - tonumber(ARGV[3]))
return want
"""

# KEYS: the records hash. ARGV: id, the open record it was read as. Mark it contested if
# it still is that record; reply: 1 if marked.
_CONTEST = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v ~= ARGV[2] then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[3])
return 1
"""

# KEYS: the records hash, then the current windows' counters. ARGV: id, usage, the
# tombstone, the budget's most transactions, the ms until `e`, `e`'s `~` value, then per
# counter the ms until it expires (times are relative: the caller's clock decides). An
# unknown id's usage charged to the current windows, and its tombstone kept unless the
# budget is full. Reply: {-1, record} when the id is there after all (the caller
# settles it), else {1 if tombstoned else 0, counter after, ...}.
_ORPHAN = """
local T = KEYS[1]
local found = redis.call('HGET', T, ARGV[1])
if found then return {-1, found} end
local out = {0}
local usage = tonumber(ARGV[2])
for i = 2, #KEYS do
  local v = redis.call('INCRBY', KEYS[i], usage)
  if v == usage then redis.call('PEXPIRE', KEYS[i], ARGV[6 + i - 1]) end
  out[i] = v
end
local held = redis.call('HLEN', T)
local records = held
if held > 0 then records = held - 1 end  -- the `~`
if records < tonumber(ARGV[4]) then
  redis.call('HSET', T, ARGV[1], ARGV[3])
  if held == 0 then
    redis.call('HSET', T, '~', ARGV[6])
    redis.call('PEXPIRE', T, ARGV[5])
  end
  out[1] = 1
end
return out
"""


# KEYS: the budget's sweep key. ARGV: now, the time until which a sweep now holds it, the
# sweeper (a process's own id), its TTL (ms). Claim the sweep unless another process's
# claim holds at now; reply: 0 if claimed, else the time it holds until.
_SWEEP = """
local v = redis.call('GET', KEYS[1])
if v then
  local sep = string.find(v, ':', 1, true)
  local until_ = tonumber(string.sub(v, 1, sep - 1))
  if until_ > tonumber(ARGV[1]) and string.sub(v, sep + 1) ~= ARGV[3] then return until_ end
end
redis.call('SET', KEYS[1], ARGV[2] .. ':' .. ARGV[3], 'PX', ARGV[4])
return 0
"""

# KEYS: the records hash. ARGV: id, value. Delete the id's record if it still holds the
# value (a claim's increment on a record that had gone, taken back); reply: 1 if deleted.
_DROP = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
return redis.call('HDEL', KEYS[1], ARGV[1])
"""


class Script:
    def __init__(self, body: str) -> None:
        self.body = body.encode()
        self.sha = hashlib.sha1(self.body).hexdigest().encode()

    def call(self, keys: Sequence[str], args: Sequence[Any], *, load: bool = False) -> bytes:
        head = ("EVAL", self.body) if load else ("EVALSHA", self.sha)
        return command(*head, len(keys), *keys, *args)


_ALL = (_FORGET, _RAISE, _CONTEST, _ORPHAN, _DROP, _SWEEP)
FORGET, RAISE, CONTEST, ORPHAN, DROP, SWEEP = map(Script, _ALL)
SCRIPTS = _ALL
