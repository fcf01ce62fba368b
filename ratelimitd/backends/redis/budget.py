"""Budgets on Redis: one Lua script per call, atomic, on the budget's two keys.

The script is `ratelimitd.backends.memory_budget` (the twin; the state is described in
`ratelimitd.config.budget_store`) line for line. KEYS are the budget's state hash and its deadline
set, which share a hash tag, so the call is one atomic script on one Cluster slot and every
key it touches is declared. The time is the caller's (ARGV), as for the other scripts: one
clock decides, and a test can drive it. Real key TTLs (PEXPIRE) only collect garbage; the
state's own `e` decides when a budget is forgotten, so Redis and the twin agree under any
clock.

The script's own Lua is most of a call's server CPU (each statement, table and
`redis.call` counts: docs/budgets.md, "Cost"), so it does only what the call needs: it looks
for expired transactions only once the hash's `d` (no deadline is before it) has passed,
sets the keys' TTLs again only when `e` moved (or on a deadline set it made anew), and hands
integers to Redis as numbers (every one below 2^53) instead of formatting them.

Sent as EVALSHA in the request's pipeline; NOSCRIPT (a restarted, flushed or failed-over
server) is answered by the same call once more as EVAL, which loads the script.

ARGV: kind, now (ms), txn ("" for none), amount, ttl (ms), flags (1: charge the estimate of a
reservation that ends without usage, 2: reserve even without room, 4: remember a refusal,
8: this release served nothing, so its own reservation is released whatever 1 says),
the most transactions the budget may hold (BUDGET_MAX_TRANSACTIONS: counted as the members
of its deadline set), the number of windows, then per window: name, algorithm (the config's
id, FIXED_WINDOW or SLIDING_WINDOW), length (ticks), tick (ms), limit; with an outbox, the
settle's event last.
Reply: {outcome, estimate, charged, expired, expired estimate, expired charged,
after 1, reset 1, after 2, reset 2, ...} (`model.Result`).

A dry run (`/explain`) never runs the script: `dry_run` reads the budgets' keys (one round)
and applies the calls to copies of them with the twin's maths (`MemoryBudgets.load`), in
order, so that a request's calls on one budget see one another as the script would.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from ...config.budget_store import MAX_BUDGET_TXNS, SWEEP_BATCH, USED_MAX, Call, Result, eligible
from ...config.windows import FIXED_WINDOW
from ..base import BackendError
from ..memory_budget import MemoryBudgets
from .claims import Claims
from .resp import ReplyError, bulk_int, command, key_slot


class Instance(Protocol):
    """What the budget calls use of an instance (`instances.RedisInstance`, which imports
    this module to encode its budget ops): its pipelined round, routed per slot or not."""

    routed: bool
    budget_max_transactions: int

    async def _run(self, cmds: list[tuple[int, bytes]]) -> list[Any]: ...

    @property
    def claims(self) -> Claims: ...


BUDGET_LUA = (
    """
local H, Z = KEYS[1], KEYS[2]
local kind = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local txn = ARGV[3]
local amount = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local flags = tonumber(ARGV[6])
local charge_policy = flags % 2 == 1
local force = flags % 4 >= 2
local remember = flags % 8 >= 4
local unserved = flags >= 8
local n = tonumber(ARGV[8])
local RESERVE, SETTLE, RELEASE, COUNT, PEEK = 1, 2, 3, 4, 5
local MAX = USED_MAX
local NEVER = 9007199254740991
local peek = kind == PEEK
-- `e`, `d` (no deadline is due before it), then each window's five fields, then the
-- transaction's record: one HMGET.
local fields = {'e', 'd'}
local wins = {}
for i = 1, n do
  local a = 3 + i * 5
  local name = ARGV[a + 1]
  wins[i] = {name = name, alg = tonumber(ARGV[a + 2]), ticks = tonumber(ARGV[a + 3]),
    tick = tonumber(ARGV[a + 4]), limit = tonumber(ARGV[a + 5])}
  local j = i * 5 - 2
  fields[j], fields[j + 1], fields[j + 2], fields[j + 3], fields[j + 4] =
    name .. '.w', name .. '.u', name .. '.r', name .. '.p', name .. '.q'
end
if kind ~= COUNT then fields[n * 5 + 3] = 't:' .. txn end
local got = redis.call('HMGET', H, unpack(fields))
local e = tonumber(got[1]) or 0
local stored_e = e
local fresh = false
if e > 0 and e <= now then
  if not peek then redis.call('DEL', H, Z) end
  fresh = true
  e = 0
end
for i, win in ipairs(wins) do
  local j = i * 5 - 2
  local w, u, r, p, q = 0, 0, 0, 0, 0
  if not fresh then
    w, u, r = tonumber(got[j]) or 0, tonumber(got[j + 1]) or 0, tonumber(got[j + 2]) or 0
    p, q = tonumber(got[j + 3]) or 0, tonumber(got[j + 4]) or 0
  end
  local t = math.floor(now / win.tick)
  local start = t - t % win.ticks
  if w < start then
    if win.alg ~= FIXED_WINDOW and w == start - win.ticks then
      p, q = u, r
    else
      p, q = 0, 0
    end
    u, r = 0, 0
    w = start
  elseif w > start then
    t = w
  end
  win.w, win.u, win.r, win.p, win.q, win.t = w, u, r, p, q, t
end
local records = {}
local own = nil
if kind ~= COUNT and not fresh then own = got[n * 5 + 3] or nil end
local function parse(rec)
  local x = {state = string.sub(rec, 1, 1), est = 0, starts = {}}
  local est = string.match(rec, '^%a (%d+)')
  if est then x.est = tonumber(est) end
  for name, w in string.gmatch(rec, '(%S+)=(%d+)') do x.starts[name] = tonumber(w) end
  return x
end
local function finish(x, charge)
  for _, win in ipairs(wins) do
    local start = x.starts[win.name]
    if start ~= nil then
      if start == win.w then
        win.r = math.max(0, win.r - x.est)
        win.u = math.min(win.u + charge, MAX)
      elseif win.alg ~= FIXED_WINDOW and start == win.w - win.ticks then
        win.q = math.max(0, win.q - x.est)
        win.p = math.min(win.p + charge, MAX)
      end
    end
  end
end
-- `due`: the next sweep (`d`): at the first deadline in Z, but not before half a TTL
-- after the sweep before.
local due = NEVER
local stored_d = tonumber(got[2])
if not fresh then due = stored_d or 0 end
local function schedule(t, rec, deadline)
  records[t] = rec
  if not peek then redis.call('ZADD', Z, deadline, t) end
  if deadline < due then due = deadline end
end
local written = false
local ended, ended_est, ended_charged = 0, 0, 0
local dropped = 0
if due <= now then
  local expired = redis.call('ZRANGEBYSCORE', Z, '-inf', now, 'LIMIT', 0, SWEEP_BATCH)
  due = NEVER
  for _, t in ipairs(expired) do
    written = true
    local rec = redis.call('HGET', H, 't:' .. t)
    local x = nil
    if rec then x = parse(rec) end
    if x and (x.state == 'o' or x.state == 'c') then
      local charge = 0
      if charge_policy then charge = x.est end
      finish(x, charge)
      ended = ended + 1
      ended_est = ended_est + x.est
      ended_charged = ended_charged + charge
      schedule(t, 'x', now + ttl)
    else
      records[t] = false
      dropped = dropped + 1
      if not peek then redis.call('ZREM', Z, t) end
    end
  end
  if #expired == SWEEP_BATCH then
    due = now  -- more may be due: the next call looks again
  elseif not peek then
    local first = redis.call('ZRANGE', Z, 0, 0, 'WITHSCORES')
    if first[2] and tonumber(first[2]) < due then due = tonumber(first[2]) end
    if due ~= NEVER and due < now + math.floor(ttl / 2) then due = now + math.floor(ttl / 2) end
  end
end
if kind ~= COUNT and records[txn] ~= nil then
  own = records[txn]
  if own == false then own = nil end
end
local x = nil
if own then x = parse(own) end
-- A new id's record would pass the budget's bound (a peek removed nothing it swept).
local full = false
local held = nil
if kind ~= COUNT and not own and not fresh then
  held = redis.call('ZCARD', Z)
  if peek then
    full = held - dropped >= tonumber(ARGV[7])
  else
    full = held >= tonumber(ARGV[7])
  end
end
if x and x.state == 'r' and (kind == RESERVE or kind == PEEK) then x = nil end
local function level(win)
  if win.alg == FIXED_WINDOW then return win.u + win.r end
  local left = win.w + win.ticks - win.t
  local pe = win.p + win.q
  if pe > win.limit then pe = win.limit end
  return math.floor((pe * left + win.ticks - 1) / win.ticks) + win.u + win.r
end
local function reset(win, asked, after)
  local fin = win.w + win.ticks - win.t
  if win.alg == FIXED_WINDOW then return fin end
  local c = win.u + win.r
  if after <= win.limit then
    if c + asked > 0 then return fin + win.ticks end
    return fin
  end
  local pe = win.p + win.q
  if pe > win.limit then pe = win.limit end
  local room = win.limit - c - asked
  if room >= 0 then return fin - math.floor(room * win.ticks / pe) end
  if asked > win.limit then return fin + win.ticks end
  local ce = c
  if ce > win.limit then ce = win.limit end
  if ce == 0 then return fin end
  return fin + win.ticks - math.floor((win.limit - asked) * win.ticks / ce)
end
-- The reply: outcome, estimate, charged, the sweep's three, then per window (after, reset).
local reply = {0, 0, 0, 0, 0, 0}
local function levels(asked)
  for i, win in ipairs(wins) do
    local after = level(win) + asked
    reply[5 + 2 * i] = after
    reply[6 + 2 * i] = reset(win, asked, after)
  end
end
local outcome, est, charged = 0, 0, 0
local function settle(charge)
  finish(x, charge)
  outcome, est, charged = 4, x.est, charge
  schedule(txn, 's', now + ttl)
  written = true
end
if kind == RESERVE or kind == PEEK then
  levels(amount)
  if full then
    outcome = 9
  elseif x then
    outcome = 3
    if x.state == 'o' and not peek then
      records[txn] = 'c' .. string.sub(own, 2)
      written = true
    end
  else
    local fits = true
    for i, win in ipairs(wins) do
      if reply[5 + 2 * i] > win.limit then fits = false end
    end
    if fits then outcome = 1 else outcome = 2 end
    if (fits or force) and not peek then
      local rec = 'o ' .. amount
      for _, win in ipairs(wins) do
        win.r = win.r + amount
        rec = rec .. ' ' .. win.name .. '=' .. win.w
      end
      schedule(txn, rec, now + ttl)
      written = true
    elseif remember and not peek then
      schedule(txn, 'r', now + ttl)
      written = true
    end
  end
elseif kind == COUNT then
  levels(amount)
  local fits = true
  for i, win in ipairs(wins) do
    local after = reply[5 + 2 * i]
    if after > win.limit then fits = false end
    if amount > 0 and (win.alg == FIXED_WINDOW or after <= win.limit) then
      win.u = math.min(win.u + amount, MAX)
      written = true
    end
  end
  if fits then outcome = 1 else outcome = 2 end
else
  if kind == SETTLE then
    if not x then
      outcome, charged = 6, amount
      for _, win in ipairs(wins) do win.u = math.min(win.u + amount, MAX) end
      if not full then schedule(txn, 's', now + ttl) end
      written = true
    elseif x.state == 'o' or x.state == 'c' then
      settle(amount)
    else
      outcome = 5
    end
  elseif kind == RELEASE then
    if not x then
      outcome = 7
    elseif x.state == 'c' then
      outcome = 8
    elseif x.state == 'o' then
      if charge_policy and not unserved then settle(x.est) else settle(0) end
    else
      outcome = 5
    end
  else
    return redis.error_reply('unknown budget call kind ' .. tostring(kind))
  end
  levels(0)
end
-- A settle, or a close that charged its estimate (`unsettled`), is one event of what was charged.
if KEYS[3] and (outcome == 6 or (outcome == 4 and (kind == SETTLE or charged > 0))) then
  redis.call('XADD', KEYS[3], '*', 't', txn, 'n', string.format('%.0f', charged),
    'at', string.format('%.0f', now), 'e', ARGV[#ARGV])
end
if written and not peek then
  -- Numbers go to Redis as integers (every one here is below 2^53).
  local set = {'e', 0, 'd', due}
  for _, win in ipairs(wins) do
    local span = win.ticks
    if win.alg ~= FIXED_WINDOW then span = 2 * win.ticks end
    -- every deadline a call sets is before its window's end + the TTL
    local fin = (win.w + span) * win.tick + ttl
    if fin > e then e = fin end
    local f = win.name
    local m = #set
    set[m + 1], set[m + 2], set[m + 3], set[m + 4] = f .. '.w', win.w, f .. '.u', win.u
    set[m + 5], set[m + 6], set[m + 7], set[m + 8] = f .. '.r', win.r, f .. '.p', win.p
    set[m + 9], set[m + 10] = f .. '.q', win.q
  end
  set[2] = e
  local gone = {}
  for t, rec in pairs(records) do
    if rec then
      set[#set + 1] = 't:' .. t
      set[#set + 1] = rec
    else
      gone[#gone + 1] = 't:' .. t
    end
  end
  redis.call('HSET', H, unpack(set))
  if #gone > 0 then redis.call('HDEL', H, unpack(gone)) end
  -- The key TTLs only collect garbage, at `e`: set again when `e` moved, and on the
  -- deadline set when this call made it anew (it had no member left).
  if e ~= stored_e then
    redis.call('PEXPIRE', H, e - now)
    redis.call('PEXPIRE', Z, e - now)
  elseif held == 0 then
    redis.call('PEXPIRE', Z, e - now)
  end
elseif not peek and not fresh and stored_e > 0 and due ~= stored_d then
  redis.call('HSET', H, 'd', due)  -- a sweep that found nothing due moved the next one
end
reply[1], reply[2], reply[3], reply[4], reply[5], reply[6] =
  outcome, est, charged, ended, ended_est, ended_charged
return reply
"""
    # The shared constants, written into the source (a script cannot import them).
    .replace("USED_MAX", str(USED_MAX))
    .replace("SWEEP_BATCH", str(SWEEP_BATCH))
    .replace("FIXED_WINDOW", str(FIXED_WINDOW))
)

_SHA = hashlib.sha1(BUDGET_LUA.encode()).hexdigest().encode()
_BODY = BUDGET_LUA.encode()


def encode(call: Call, max_txns: int = MAX_BUDGET_TXNS, *, load: bool = False) -> bytes:
    """The RESP call of `call` on a budget holding at most `max_txns` transactions
    (EVALSHA; EVAL with `load`)."""
    state = call.key.encode()
    due = state + b"_due"
    args = [
        bulk_int(call.kind),
        bulk_int(call.now),
        _bulk(call.txn.encode()),
        bulk_int(call.amount),
        bulk_int(call.ttl),
        bulk_int(call.charge + 2 * call.force + 4 * call.remember + 8 * call.unserved),
        bulk_int(max_txns),
        bulk_int(len(call.windows)),
    ]
    for win in call.windows:
        args += (
            _bulk(win.name.encode()),
            bulk_int(win.algorithm),
            bulk_int(win.ticks),
            bulk_int(win.tick),
            bulk_int(win.limit),
        )
    keys = [_bulk(state), _bulk(due)]
    if call.outbox:  # KEYS[3] and the last ARGV: the settle outbox (`budget.outbox`)
        keys.append(_bulk(call.outbox.encode()))
        args.append(_bulk(call.event.encode()))
    n = 3 + len(keys) + len(args)
    if load:
        head = b"*%d\r\n$4\r\nEVAL\r\n$%d\r\n%b\r\n$1\r\n%d\r\n" % (
            n, len(_BODY), _BODY, len(keys))  # fmt: skip
    else:
        head = b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%b\r\n$1\r\n%d\r\n" % (n, _SHA, len(keys))
    return b"".join((head, *keys, *args))


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(data), data)


def decode(reply: Any) -> Result:
    """A script reply as a Result; anything else raises BackendError."""
    if reply.__class__ is not list or len(reply) < 6:
        if isinstance(reply, ReplyError):
            raise BackendError(str(reply))
        raise BackendError(f"unexpected redis reply {reply!r}")
    levels = tuple((reply[i], reply[i + 1]) for i in range(6, len(reply), 2))
    return Result(reply[0], levels, reply[1], reply[2], reply[3], reply[4], reply[5])


class RedisBudgets:
    """Budget calls on one Redis deployment (single, sentinel or cluster): a budget of fixed
    windows without an outbox in plain commands (`claims`); any other, each call one script,
    all the calls of one `run` in one pipelined round (per node on a cluster)."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance

    async def run(self, calls: Sequence[Call]) -> list[Result]:
        """Apply the calls (in order on one budget); one Result each."""
        return await split(calls, self.instance.claims.run, self.scripted)

    async def scripted(self, calls: Sequence[Call]) -> list[Result]:
        """The calls, each one script, in one round."""
        inst = self.instance
        slots = [key_slot(c.key.encode()) for c in calls]
        most = inst.budget_max_transactions
        cmds = [(slot, encode(c, most)) for slot, c in zip(slots, calls, strict=True)]
        replies = await inst._run(cmds)  # the instance's one round, routed per slot
        missing = [
            i
            for i, reply in enumerate(replies)
            if isinstance(reply, ReplyError) and str(reply).startswith("NOSCRIPT")
        ]
        if missing:  # the server lost its scripts: EVAL loads them again
            again = [(slots[i], encode(calls[i], most, load=True)) for i in missing]
            for i, reply in zip(missing, await inst._run(again), strict=True):
                replies[i] = reply
        return [decode(reply) for reply in replies]

    async def dry_run(self, calls: Sequence[Call]) -> list[Result]:
        """What `run(calls)` would answer now, writing nothing (module docstring)."""
        return await dry_run(self.instance, calls)


async def split(
    calls: Sequence[Call],
    claimed: Callable[[Sequence[Call]], Awaitable[list[Result]]],
    scripted: Callable[[Sequence[Call]], Awaitable[list[Result]]],
) -> list[Result]:
    """The calls of budgets kept in commands (`claims.eligible`) by `claimed`, the others by
    `scripted`, each in order, the Results in the calls' order. A budget is one rule's, so
    all its calls go one way."""
    mine = [eligible(call) for call in calls]
    if all(mine):
        return await claimed(calls)
    if not any(mine):
        return await scripted(calls)
    first = await claimed([c for c, m in zip(calls, mine, strict=True) if m])
    other = await scripted([c for c, m in zip(calls, mine, strict=True) if not m])
    a, b = iter(first), iter(other)
    return [next(a) if m else next(b) for m in mine]


async def dry_run(inst: Instance, calls: Sequence[Call]) -> list[Result]:
    """`calls` applied in order to copies of their budgets as `inst` holds them, with the
    twin's maths; each Result with `held`."""
    return await split(calls, inst.claims.dry_run, lambda c: _scripted_dry_run(inst, c))


async def _scripted_dry_run(inst: Instance, calls: Sequence[Call]) -> list[Result]:
    """`dry_run` of budgets kept by the script (one round of HGETALL and ZRANGE each)."""
    keys = list(dict.fromkeys(call.key for call in calls))
    cmds = []
    for key in keys:
        state = key.encode()
        slot = key_slot(state) if inst.routed else 0
        cmds.append((slot, command("HGETALL", state)))
        cmds.append((slot, command("ZRANGE", state + b"_due", "0", "-1", "WITHSCORES")))
    replies = await inst._run(cmds)
    # Redis holds the budgets: the process's own bound has nothing to count here.
    scratch = MemoryBudgets(inst.budget_max_transactions, sys.maxsize)
    for i, key in enumerate(keys):
        fields, due = replies[2 * i], replies[2 * i + 1]
        for reply in (fields, due):
            if reply.__class__ is not list:
                raise BackendError(str(reply) if isinstance(reply, ReplyError) else repr(reply))
        scratch.load(key, dict(zip(fields[::2], fields[1::2], strict=True)), due)
    return scratch.dry_run(calls)
