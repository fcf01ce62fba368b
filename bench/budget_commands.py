"""Token budgets on Redis without Lua: what the command-only design sketched in
docs/budgets.md ("Cost") costs the server, on a prototype of its calls, against a plain
decision (INCRBY + EXPIRE) and the budget script (`backends/redis/budget.py`) in one run.

    .venv/bin/python bench/budget_commands.py [--calls 20000] [--repeat 5] [--no-check]

The prototype (`CommandBudget`) is one budget on one fixed window, its calls written as
the plain commands the design sends, round by round, and the answer each round's replies
give. It is not the store: it has no sliding windows, no outbox, no levels' resets, no
dry run; it exists to price the design and to check, on a real redis-server, the
properties the store must keep (`check`): no overshoot under concurrent reserves, a
retried reserve reserving once, a duplicate or retried settle charged once (also when the
settle's first round reached the store and its second did not), expiry by a sweep.

Server cost: µs per call from INFO commandstats (the commands' own execution, as the
script's is measured: EVALSHA's figure includes the commands the script calls, EXEC's the
commands it runs), summed over each call's top-level commands, in steady state (64
budgets, ten open reservations on each while they are reserved then settled, in chunks),
alternating the designs chunk by chunk; median of --repeat runs. Writes
bench/results/budget_commands.{json,md}. The machine may be shared: quote ratios of one
run.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import redis
from support.machine import machine_info
from support.redis_server import RedisServers

from ratelimitd.backends.redis import budget as lua
from ratelimitd.config.budget_store import RELEASE, RESERVE, SETTLE, Call, budget_keys, fixed

BIG = 2**31  # never over: every measured call takes the admitted path
ESTIMATE, USAGE = 700, 500
TTL = 600_000  # reservation_ttl (ms), the default 10m
NOW = 1_764_936_123_456  # a fixed clock (ms): every call in one hourly window
BUDGETS = 64  # users, as bench/budget.py
CHUNK = BUDGETS * 10  # transactions reserved, then settled, per chunk: ten open per budget

ADMITTED, REFUSED, DUPLICATE, SETTLED, FINISHED, ORPHAN = (
    "admitted",
    "refused",
    "duplicate",
    "settled",
    "finished",
    "orphan",
)

Command = tuple[Any, ...]


class CommandBudget:
    """One budget on one fixed window of `seconds`, as the command-only design keeps it.

    Keys (one hash tag, so one Cluster slot): per window start one counter `level`
    (used + reserved: named by the window's start, so nothing rolls), per transaction a
    record `t:<id>` (`o <estimate> <reserve attempt> <window start>` while open, then a
    tombstone `s <settle attempt>` / `x` / `r`), and `due`, a sorted set of the open
    transactions' deadlines for the sweep. An attempt is a random id a call keeps across
    its retries: it is how a retry recognises what its earlier attempt did.
    """

    def __init__(self, name: str, limit: int, seconds: int = 3600, ttl: int = TTL) -> None:
        self.base = f"{{{name}}}b"
        self.limit = limit
        self.seconds = seconds
        self.ttl = ttl

    def level(self, now: int) -> str:
        start = now // 1000 - now // 1000 % self.seconds
        return f"{self.base}:l:{start}"

    def record(self, txn: str) -> str:
        return f"{self.base}:t:{txn}"

    @property
    def due(self) -> str:
        return f"{self.base}:due"

    # A reserve: one round when admitted (the common case), a second to undo its
    # increment when refused, when its id is taken, or when it is a retry of itself.

    def reserve(self, txn: str, est: int, now: int, attempt: str) -> list[Command]:
        level = self.level(now)
        # The counter lives until its window has ended and every reservation made in it
        # can have been settled: PEXPIRE NX sets that once, on the call that created it.
        span = (self.seconds * 1000 - now % (self.seconds * 1000)) + 2 * self.ttl
        return [
            ("INCRBY", level, est),
            ("PEXPIRE", level, span, "NX"),
            ("SET", self.record(txn), f"o {est} {attempt} {level}", "NX", "PX", 2 * self.ttl,
             "GET"),  # fmt: skip
            ("ZADD", self.due, "NX", now + self.ttl, txn),
        ]

    def reserved(
        self, txn: str, est: int, now: int, attempt: str, replies: list[Any]
    ) -> tuple[str, list[Command]]:
        """The answer of a reserve's first round, and its second round (none: done)."""
        after, old = replies[0], replies[2]
        undo = ("INCRBY", self.level(now), -est)
        if old is None:  # the record is ours, new
            if after <= self.limit:
                return ADMITTED, []
            return REFUSED, [undo, ("DEL", self.record(txn)), ("ZREM", self.due, txn)]
        old = old.decode()
        if old.startswith("o ") and old.split()[2] == attempt:  # our own retry: as the first
            return ADMITTED, [undo]
        second = [undo]
        if old.startswith("o "):  # a reused id: the open one is contested (only its settle
            # or its deadline can end it, so the reuse cannot free someone else's tokens)
            second.append(("SET", self.record(txn), "c" + old[1:], "XX", "KEEPTTL"))
        return DUPLICATE, second

    # A settle: the first round claims the record (APPEND: the first claim after the
    # record is the taker, whoever else appends), the second, the taker's, applies it in
    # one MULTI: so a settle whose first round reached the store and whose second did not
    # is finished by its retry, and is never applied twice.

    def settle(self, txn: str, usage: int, attempt: str) -> list[Command]:
        rec = self.record(txn)
        return [
            ("APPEND", rec, f"|{attempt} {usage}"),
            ("PEXPIRE", rec, 2 * self.ttl, "NX"),  # a claim on nothing (an orphan) expires
            ("GET", rec),
        ]

    def settled(
        self,
        txn: str,
        usage: int,
        now: int,
        attempt: str,
        replies: list[Any],
        tombstone: str = "s",
    ) -> tuple[str, list[Command]]:
        head, *claims = replies[2].decode().split("|")
        mine = claims[0].split()[0] == attempt
        if head.startswith(("s ", "x")):
            return (SETTLED if head == f"s {attempt}" else FINISHED), []
        if not mine or head.startswith("r"):
            return FINISHED, []  # another settle took it, or a remembered refusal
        end = ("SET", self.record(txn), f"{tombstone} {attempt}", "PX", self.ttl)
        if not head:  # nothing was reserved under this id: its usage, once, to now
            level = self.level(now)
            span = (self.seconds * 1000 - now % (self.seconds * 1000)) + 2 * self.ttl
            apply = [("INCRBY", level, usage), ("PEXPIRE", level, span, "NX"), end]
            return ORPHAN, [("MULTI",), *apply, ("EXEC",)]
        _, est, _, level = head.split()
        apply = [("INCRBY", level, usage - int(est)), end, ("ZREM", self.due, txn)]
        return SETTLED, [("MULTI",), *apply, ("EXEC",)]

    # The settle as docs/budgets.md sketched it first: GETDEL, then the writes. Cheaper
    # by a command, but a retry of a settle whose GETDEL reached the store and whose
    # writes did not finds nothing and charges its usage as an orphan, while the
    # reservation's estimate stays held: measured for comparison only.

    def settle_getdel(self, txn: str) -> list[Command]:
        return [("GETDEL", self.record(txn))]

    def settled_getdel(self, txn: str, usage: int, attempt: str, replies: list[Any]) -> list[Command]:
        _, est, _, level = replies[0].decode().split()
        return [
            ("INCRBY", level, usage - int(est)),
            ("SET", self.record(txn), f"s {attempt}", "PX", self.ttl),
            ("ZREM", self.due, txn),
        ]

    # Expiry: the daemon's periodic sweep, not a step of every call.

    def sweep(self, now: int) -> list[Command]:
        return [("ZRANGEBYSCORE", self.due, "-inf", now, "LIMIT", 0, 64)]


def raw(client: redis.Redis) -> redis.Redis:
    """A client on `client`'s connections that hands back replies as the server sent them
    (redis-py turns a SET's reply into a bool, even SET ... GET's old value)."""
    out = redis.Redis(connection_pool=client.connection_pool)
    out.response_callbacks.clear()
    return out


def pipeline(client: redis.Redis, commands: Iterable[Command]) -> list[Any]:
    """One round of `commands` (replies as sent: `raw`); errors raised."""
    pipe = raw(client).pipeline(transaction=False)
    for cmd in commands:
        pipe.execute_command(*cmd)
    return pipe.execute()


# The calls one at a time, a round per round trip, as a daemon makes them.


def reserve(client: redis.Redis, b: CommandBudget, txn: str, est: int, now: int,
            attempt: str) -> str:  # fmt: skip
    answer, second = b.reserved(txn, est, now, attempt, pipeline(client, b.reserve(txn, est, now, attempt)))
    if second:
        pipeline(client, second)
    return answer


def settle(client: redis.Redis, b: CommandBudget, txn: str, usage: int, now: int, attempt: str,
           *, first_round_only: bool = False, tombstone: str = "s") -> str:  # fmt: skip
    replies = pipeline(client, b.settle(txn, usage, attempt))
    answer, second = b.settled(txn, usage, now, attempt, replies, tombstone)
    if second and not first_round_only:
        pipeline(client, second)
    return answer


def sweep(client: redis.Redis, b: CommandBudget, now: int, *, charge: bool) -> int:
    """End the reservations past their deadline by the policy (charge the estimate, or
    release it), through the settle's claim: a settle racing the sweep is applied once."""
    ended = 0
    for txn in pipeline(client, b.sweep(now))[0]:
        txn = txn.decode()
        rec = client.get(b.record(txn))
        est = int(rec.split()[1]) if rec and rec[:1] in (b"o", b"c") else 0
        answer = settle(client, b, txn, est if charge else 0, now, "sweep-" + secrets.token_hex(4),
                        tombstone="x")  # fmt: skip
        if answer != SETTLED:
            client.zrem(b.due, txn)  # a tombstone or a settle's: nothing to end
        ended += answer == SETTLED
    return ended


def check(address: str) -> dict[str, str]:
    """The properties the store must keep, on the prototype (module docstring)."""
    host, port = address.split(":")
    client = redis.Redis(host=host, port=int(port))
    client.flushall()
    out = {}

    # Concurrent reserves, each thread its own connection: none admitted past the limit.
    b = CommandBudget("crowd", limit=10_000)
    admitted: list[int] = []
    lock = threading.Lock()

    def crowd(k: int) -> None:
        c = redis.Redis(host=host, port=int(port))
        for i in range(25):
            est = 300 + (k * 37 + i * 11) % 900
            if reserve(c, b, f"t{k}-{i}", est, NOW, secrets.token_hex(4)) == ADMITTED:
                with lock:
                    admitted.append(est)
        c.close()

    threads = [threading.Thread(target=crowd, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    level = int(client.get(b.level(NOW)))
    assert sum(admitted) <= b.limit and level == sum(admitted), (sum(admitted), level)
    out["overshoot"] = f"8 threads x 25 reserves: {len(admitted)} admitted, {sum(admitted)} of {b.limit}, level {level}"

    b = CommandBudget("ann", limit=10_000)
    # A retried reserve (its reply lost) answers as the first did, reserving once.
    assert reserve(client, b, "r1", 1000, NOW, "a1") == ADMITTED
    assert reserve(client, b, "r1", 1000, NOW, "a1") == ADMITTED
    assert int(client.get(b.level(NOW))) == 1000
    # A reused id is refused, holding nothing more.
    assert reserve(client, b, "r1", 1000, NOW, "a2") == DUPLICATE
    assert int(client.get(b.level(NOW))) == 1000
    # A settle whose first round reached the store and whose second did not: its retry
    # finishes it; a retry after that answers as it did; another settle changes nothing.
    assert settle(client, b, "r1", 800, NOW, "s1", first_round_only=True) == SETTLED
    assert int(client.get(b.level(NOW))) == 1000
    assert settle(client, b, "r1", 800, NOW, "s1") == SETTLED
    assert settle(client, b, "r1", 800, NOW, "s1") == SETTLED
    assert settle(client, b, "r1", 800, NOW, "s2") == FINISHED
    assert int(client.get(b.level(NOW))) == 800
    # A settle of an id never reserved charges its usage once.
    assert settle(client, b, "o1", 50, NOW, "s3") == ORPHAN
    assert settle(client, b, "o1", 50, NOW, "s4") == FINISHED
    assert int(client.get(b.level(NOW))) == 850
    out["idempotency"] = "reserve retried: once; reused id: refused; settle retried after its first round: once; duplicate settle: once; orphan: once"

    # Expiry by the sweep, by policy: charged, then released; a late settle changes nothing.
    assert reserve(client, b, "e1", 1000, NOW, "a3") == ADMITTED
    assert sweep(client, b, NOW + TTL - 1, charge=True) == 0
    assert sweep(client, b, NOW + TTL, charge=True) == 1
    assert settle(client, b, "e1", 10, NOW, "s5") == FINISHED
    assert reserve(client, b, "e2", 1000, NOW, "a4") == ADMITTED
    assert sweep(client, b, NOW + TTL, charge=False) == 1
    assert int(client.get(b.level(NOW))) == 1850 and client.zcard(b.due) == 0
    out["expiry"] = "the sweep ends a reservation at its deadline, charged or released by policy; a late settle changes nothing"
    client.flushall()
    client.close()
    return out


# Measurement.


def commandstats(client: redis.Redis) -> dict[str, float]:
    return {k[len("cmdstat_"):]: float(v["usec"]) for k, v in client.info("commandstats").items()}


class Meter:
    """Server µs of each call kind's top-level commands, accumulated over chunks."""

    # A call's top-level commands: EVALSHA's and EXEC's figures include what they run.
    TOP = {
        "plain": ("incrby", "expire"),
        "script_reserve": ("evalsha",),
        "script_settle": ("evalsha",),
        "reserve": ("incrby", "pexpire", "set", "zadd"),
        "settle": ("append", "pexpire", "get", "multi", "exec"),
        "settle_getdel": ("getdel", "incrby", "set", "zrem"),
    }

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.usec = {name: 0.0 for name in self.TOP}
        self.calls = {name: 0 for name in self.TOP}

    def measure(self, name: str, calls: int, work: Callable[[], None]) -> None:
        before = commandstats(self.client)
        work()
        after = commandstats(self.client)
        self.usec[name] += sum(after.get(k, 0.0) - before.get(k, 0.0) for k in self.TOP[name])
        self.calls[name] += calls

    def per_call(self) -> dict[str, float]:
        return {name: self.usec[name] / self.calls[name] for name in self.TOP}


def resp_args(data: bytes) -> list[bytes]:
    """The arguments of one RESP array of bulk strings (`lua.encode`'s call)."""
    lines = data.split(b"\r\n")
    return [lines[i] for i in range(2, 2 * int(lines[0][1:]) + 1, 2)]


def run_once(client: redis.Redis, calls: int, tag: str) -> dict[str, float]:
    """One run of every design on fresh transactions, chunk by chunk, alternating."""
    client.flushall()
    meter = Meter(client)
    budgets = [CommandBudget(f"u{u}", BIG) for u in range(BUDGETS)]
    window = (fixed(3600, BIG),)
    states = [budget_keys("", "llm", [("user", f"u{u}")])[0] for u in range(BUDGETS)]

    def script(kind: int, u: int, txn: str, amount: int) -> Command:
        c = Call(kind, states[u], window, NOW, txn, amount, TTL, charge=True)
        return tuple(resp_args(lua.encode(c)))

    client.execute_command(*resp_args(lua.encode(Call(RELEASE, "warm", window, NOW, "w", 0, TTL), load=True)))
    for chunk in range(calls // CHUNK):
        ids = [(i % BUDGETS, f"{tag}{chunk}-{i}") for i in range(CHUNK)]

        def plain() -> None:
            pipeline(client, (c for u, _ in ids for c in (("INCRBY", f"{{u{u}}}k", ESTIMATE),
                                                         ("EXPIRE", f"{{u{u}}}k", 3600))))  # fmt: skip

        def script_reserve() -> None:
            for reply in pipeline(client, (script(RESERVE, u, t, ESTIMATE) for u, t in ids)):
                assert reply[0] == 1, reply

        def script_settle() -> None:
            for reply in pipeline(client, (script(SETTLE, u, t, USAGE) for u, t in ids)):
                assert reply[0] == 4, reply

        def command_reserve(prefix: str) -> Callable[[], None]:
            def work() -> None:
                rounds = [budgets[u].reserve(prefix + t, ESTIMATE, NOW, "a" + t) for u, t in ids]
                replies = iter(pipeline(client, (c for r in rounds for c in r)))
                for (u, t), r in zip(ids, rounds, strict=True):
                    answer, second = budgets[u].reserved(prefix + t, ESTIMATE, NOW, "a" + t,
                                                         [next(replies) for _ in r])  # fmt: skip
                    assert answer == ADMITTED and not second, answer
            return work

        def command_settle() -> None:
            rounds = [budgets[u].settle("c" + t, USAGE, "s" + t) for u, t in ids]
            replies = iter(pipeline(client, (c for r in rounds for c in r)))
            seconds = []
            for (u, t), r in zip(ids, rounds, strict=True):
                answer, second = budgets[u].settled("c" + t, USAGE, NOW, "s" + t,
                                                    [next(replies) for _ in r])  # fmt: skip
                assert answer == SETTLED, answer
                seconds += second
            pipeline(client, seconds)

        def command_settle_getdel() -> None:
            rounds = [budgets[u].settle_getdel("g" + t) for u, t in ids]
            replies = pipeline(client, (c for r in rounds for c in r))
            seconds = []
            for (u, t), reply in zip(ids, replies, strict=True):
                seconds += budgets[u].settled_getdel("g" + t, USAGE, "s" + t, [reply])
            pipeline(client, seconds)

        meter.measure("plain", CHUNK, plain)
        meter.measure("script_reserve", CHUNK, script_reserve)
        meter.measure("reserve", CHUNK, command_reserve("c"))
        meter.measure("script_settle", CHUNK, script_settle)
        meter.measure("settle", CHUNK, command_settle)
        command_reserve("g")()  # what the GETDEL settle takes (not measured: a reserve as above)
        meter.measure("settle_getdel", CHUNK, command_settle_getdel)
    return meter.per_call()


def sweep_cost(client: redis.Redis, n: int) -> float:
    """Server µs of one sweep of one budget that has nothing due (its usual case)."""
    b = CommandBudget("sweep", BIG)
    for i in range(8):
        pipeline(client, b.reserve(f"s{i}", ESTIMATE, NOW, "a"))
    before = commandstats(client).get("zrangebyscore", 0.0)
    pipeline(client, (b.sweep(NOW)[0] for _ in range(n)))
    return (commandstats(client)["zrangebyscore"] - before) / n


def render(result: dict[str, Any]) -> str:
    r, m = result["server_us"], result["machine"]
    plain = r["plain"]
    rows = [
        ("plain", "INCRBY + EXPIRE"),
        ("script_reserve", "the script (EVALSHA), today"),
        ("reserve", "INCRBY, PEXPIRE NX, SET NX PX GET, ZADD NX: one round"),
        ("script_settle", "the script (EVALSHA), today"),
        ("settle", "APPEND, PEXPIRE NX, GET; then MULTI INCRBY SET ZREM EXEC: two rounds"),
        ("settle_getdel", "GETDEL; then INCRBY, SET, ZREM: two rounds, not retry-safe"),
    ]
    lines = [
        "# Token budgets on Redis without Lua (bench/budget_commands.py)",
        "",
        "Command: `.venv/bin/python bench/budget_commands.py` (one run: every design measured",
        f"chunk by chunk, alternating; median of {result['args']['repeat']} runs of "
        f"{result['args']['calls']} calls each). Redis server µs per call from INFO",
        "commandstats (each call's top-level commands; EVALSHA and EXEC include what they run),",
        "64 budgets with ten open reservations each, one hourly fixed window, estimate 700,",
        "usage 500. A prototype of the calls (`CommandBudget`), not the store.",
        "",
        f"Machine: {m.get('cpu')}, {m.get('redis-server')}. Load average before and after: "
        + ", ".join(" / ".join(f"{x:.2f}" for x in result["load_average"][w]) for w in ("before", "after"))
        + " (a shared machine: other builds and tests ran).",
        "",
        "| call | commands | server µs | x plain | runs (µs) |",
        "|---|---|---:|---:|---|",
    ]
    for name, what in rows:
        runs = ", ".join(f"{x:.2f}" for x in result["runs"][name])
        lines.append(f"| {name} | {what} | {r[name]:.2f} | {r[name] / plain:.2f} | {runs} |")
    lines += [
        "",
        f"A sweep of a budget with nothing due (ZRANGEBYSCORE): {result['sweep_us']:.2f} µs, "
        "once per budget per sweep period, not per call.",
        "",
        "Per command, µs per call in the last run's command-only calls: "
        + ", ".join(f"{k} {v:.2f}" for k, v in result["per_command"].items())
        + ".",
        "",
    ]
    if result.get("check"):
        lines += ["Checked on the prototype against the same server:", ""]
        lines += [f"- {k}: {v}" for k, v in result["check"].items()]
        lines.append("")
    return "\n".join(lines)


def per_command(client: redis.Redis, calls: int) -> dict[str, float]:
    """µs per call of each command of the command-only reserve and settle (one pass)."""
    client.flushall()
    b = [CommandBudget(f"u{u}", BIG) for u in range(BUDGETS)]
    client.config_resetstat()
    n = 0
    for chunk in range(calls // CHUNK):
        ids = [(i % BUDGETS, f"p{chunk}-{i}") for i in range(CHUNK)]
        rounds = [b[u].reserve(t, ESTIMATE, NOW, "a") for u, t in ids]
        pipeline(client, (c for r in rounds for c in r))
        rounds = [b[u].settle(t, USAGE, "s") for u, t in ids]
        replies = iter(pipeline(client, (c for r in rounds for c in r)))
        seconds = []
        for (u, t), r in zip(ids, rounds, strict=True):
            seconds += b[u].settled(t, USAGE, NOW, "s", [next(replies) for _ in r])[1]
        pipeline(client, seconds)
        n += CHUNK
    stats = commandstats(client)
    return {k: v / n for k, v in stats.items() if k not in ("config|resetstat", "info")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-check", action="store_true", help="skip the prototype's checks")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        servers = RedisServers(Path(tmp))
        try:
            server = servers()
            client = server.client()
            checked = {} if args.no_check else check(server.address)
            runs = [run_once(client, args.calls, f"r{i}-") for i in range(args.repeat)]
            swept = sweep_cost(client, args.calls)
            commands = per_command(client, args.calls)
        finally:
            servers.stop_all()
    names = runs[0].keys()
    result = {
        "machine": machine_info(),
        "args": vars(args),
        "server_us": {n: round(statistics.median(r[n] for r in runs), 3) for n in names},
        "runs": {n: [round(r[n], 3) for r in runs] for n in names},
        "sweep_us": round(swept, 3),
        "per_command": {k: round(v, 3) for k, v in sorted(commands.items())},
        "check": checked,
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }
    out = Path(__file__).parent / "results"
    (out / "budget_commands.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "budget_commands.md").write_text(render(result))
    print(render(result))


if __name__ == "__main__":
    main()
