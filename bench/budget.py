"""Token budgets: CPU per reserve and per settle against a plain decision, Redis round trips
per call, and the overshoot of one concurrency workload through the real Envoy, reserve /
settle against check-then-report.

    .venv/bin/python bench/budget.py [--calls 20000] [--redis-calls 4000] [--repeat 5] [--no-envoy]
                                     [--baseline TREE --baseline-label COMMIT]

1. Decisions, through the service (build_core: plan, count, verdict, as a gRPC call is
   decided once parsed), on one rule shape: `user` with an hourly limit never reached, in
   a domain without `budget:` (the plain decision, hits 700) and in one with it. A reserve
   (phase, user, txn; hits 700), a settle (hits 500) of a reservation, the stream end as
   Envoy sends it (settle then close in one call), and a whole transaction (reserve, then
   its stream end: two calls). Memory: CPU (time.process_time) per call. Redis (a
   redis-server started on a free port; one caller, then 64 concurrent ones, which the
   backend pipelines): the client's CPU per call, the server's µs per call (INFO
   commandstats, every command: a script's own commands, counted in its figure and under
   their names, count twice, so an upper bound) and round trips per call (the backend's
   pipelined writes / calls). The budget rule has fixed windows and no outbox, so Redis
   keeps it in plain commands (`backends/redis/claims.py`). The Redis figures run on a
   clock of their own (STEP a call) after WARM seconds of transactions on it, so that the
   budgets hold what a running daemon's hold and their sweeps fall among the calls.
   Median of --repeat runs; ratios to the plain decision of the same run.
2. Redis server CPU in the steady state (`server_cpu`, on a server of its own): batches
   of plain decisions and of transactions as a daemon sees them (each stream end a minute
   after its reserve) alternate, every sweep counted; per call the server process's CPU
   (its threads' run time: what it spends reading, parsing, running and replying) and the
   commands' own time (INFO commandstats), one caller on one daemon, 64 on one, and 64 on
   two daemons sharing the budgets. Medians of --repeat, and of the ratios per pair.
3. The workload (tests/support/llm_stack): N concurrent streams, each asking max_tokens and
   using less, through Envoy on the check-then-report example and on the reserve example,
   one after the other in this run: tokens charged against the limit, the overshoot.

With --baseline, the memory figures of another source tree (an earlier commit, e.g. from
`git archive`, with its extensions built beside its sources) are measured in the same run,
in a child process, alternating with this tree's run by run: before and after side by side.

Writes bench/results/budget.json and budget.md. The machine may be shared: quote ratios
of one run, not absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import uvloop
from support.budget import call
from support.llm_stack import EXAMPLES, concurrent_streams, llm_stack
from support.machine import machine_info
from support.ready import wait_for
from support.redis_server import RedisServers
from support.report import load_averages, table

from ratelimitd.backends import MemoryBackend, memory_budget
from ratelimitd.backends.redis import RedisBackend
from ratelimitd.config import ConfigFile
from ratelimitd.core import build_core
from ratelimitd.messages import OK, Descriptor, Request
from ratelimitd.settings import RedisSettings

BIG = 2**31  # never over: every call takes the same path
RULE = f"  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: {BIG}}}\n"
CONFIGS = [
    ConfigFile("plain.yaml", "domain: plain\ndescriptors:\n" + RULE),
    ConfigFile("llm.yaml", "domain: llm\ndescriptors:\n" + RULE + "    budget: {}\n"),
]
ESTIMATE, USAGE = 700, 500
# The Redis figures run on a clock of their own, STEP seconds a call (64 users: about one
# call a second each), after WARM seconds of transactions on it: a budget is then in the
# steady state of a daemon that has run a while, holding about TTL + half a TTL of records
# (the default reservation TTL, 10 minutes), its sweep deleting what reserves add and
# counted in the calls that make it.
STEP, WARM = 0.015, 1_200
# The steady-state server CPU (`server_cpu`): settles LAG calls after their reserves (a
# stream of a minute), batches of STEADY transaction calls (two sweep periods, a TTL, on
# STEP: every budget swept twice a batch) against PLAIN plain decisions.
LAG, STEADY, PLAIN = 4_000, 40_000, 20_000
CALLS = ("plain", "reserve", "settle", "stream_end", "transaction")
SETTLED = "ratelimit.service.rate_limit.llm.user.budget_settled"
CALLERS = 64  # concurrent callers of the second Redis run
NOT_CALLS = ("cmdstat_config|resetstat:", "cmdstat_info:")  # the benchmark's own
SCRIPTS = ("cmdstat_evalsha:", "cmdstat_eval:")

# The concurrency workload: as tests/envoy/test_budget_envoy.py.
STREAMS, MAX_TOKENS, WORKLOAD_USAGE, LIMIT = 40, 1000, 800, 10_000


class Clock:
    """A clock the benchmark advances (`redis_figures`)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Calls:
    """The requests of one measured batch of `n` calls, on 64 users, transactions named
    with `tag` (fresh per batch: a reserve of a known id is refused, and a stream end of a
    finished one changes nothing)."""

    def __init__(self, n: int, tag: str) -> None:
        users = [f"u{i % 64}" for i in range(n)]
        txns = [f"{tag}{i}" for i in range(n)]
        self.plain = [
            Request("plain", [Descriptor((("user", u),), hits_addend=ESTIMATE)]) for u in users
        ]
        self.reserve = [
            Request("llm", [call("reserve", t, ESTIMATE, u)])
            for u, t in zip(users, txns, strict=True)
        ]
        self.settle = [
            Request("llm", [call("settle", t, USAGE, u)]) for u, t in zip(users, txns, strict=True)
        ]
        self.stream_end = [
            Request("llm", [call("settle", t, USAGE, u), call("close", t, 200, u)])
            for u, t in zip(users, txns, strict=True)
        ]

    def batches(self, name: str) -> tuple[list[Request], list[Request], int]:
        """(untimed set-up calls, timed calls, calls a figure is per) of call `name`."""
        if name == "plain":
            return [], self.plain, len(self.plain)
        if name == "reserve":
            return [], self.reserve, len(self.reserve)
        if name == "settle":
            return self.reserve, self.settle, len(self.settle)
        if name == "stream_end":
            return self.reserve, self.stream_end, len(self.stream_end)
        # A transaction: its reserve then its stream end, figures per transaction.
        return [], interleave(self.reserve, self.stream_end), len(self.reserve)


def interleave(a: list[Request], b: list[Request]) -> list[Request]:
    return [r for pair in zip(a, b, strict=True) for r in pair]


def batches(
    n: int, repeat: int, tag: str = ""
) -> Iterator[tuple[str, list[Request], list[Request], int]]:
    """Every call's batch, `repeat` times, in one order (fresh transactions each)."""
    for run in range(repeat):
        for name in CALLS:
            yield name, *Calls(n, f"{tag}{name}{run}-").batches(name)


def memory_figures(n: int, repeat: int) -> dict[str, float]:
    """µs of CPU per call on the memory backend (driven without an event loop)."""
    core = build_core(backend=MemoryBackend())
    core.load(CONFIGS)
    decide: Callable[[Request], Any] = core.service.decide
    decide(Request("llm", [call("reserve", "warm", 1, "w")]))
    runs: dict[str, list[float]] = {name: [] for name in CALLS}
    for name, setup, timed, per in batches(n, repeat):
        for request in setup:
            decide(request)
        before = settled(core)
        start = time.process_time()
        for request in timed:
            decide(request)
        runs[name].append((time.process_time() - start) / per * 1e6)
        check(name, core, before, per)
    return {name: round(statistics.median(r), 3) for name, r in runs.items()}


def memory_side_by_side(
    n: int, repeat: int, baseline: Path | None
) -> tuple[dict[str, float], dict[str, float] | None]:
    """`memory_figures` of this tree and, when given, of `baseline`, alternating run by run
    (medians of `repeat` runs each)."""
    if baseline is None:
        return memory_figures(n, repeat), None
    runs: list[dict[str, float]] = []
    before: list[dict[str, float]] = []
    for _ in range(repeat):
        runs.append(memory_figures(n, 1))
        before.append(baseline_figures(baseline, n))
    return medians(runs), medians(before)


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {name: round(statistics.median(r[name] for r in runs), 3) for name in runs[0]}


def baseline_figures(tree: Path, n: int) -> dict[str, float]:
    """One `memory_figures` run of source tree `tree`, in a child process that imports it."""
    code = (
        "import json, sys; sys.path.insert(0, 'bench'); import budget; "
        f"print(json.dumps(budget.memory_figures({n}, 1)))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tree), str(tree / "tests")))}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def settled(core: Any) -> float:
    return core.stats.snapshot().get(SETTLED, 0)  # type: ignore[no-any-return]


def check(name: str, core: Any, before: float, per: int) -> None:
    """Each settle of the batch settled a reservation (not a duplicate or an orphan)."""
    expected = 0 if name in ("plain", "reserve") else per
    assert settled(core) - before == expected, (name, settled(core) - before, expected)


def command_usec(server: Any) -> dict[str, float]:
    """Redis server µs per command since CONFIG RESETSTAT (`cmdstat_<name>:`), the commands a
    script calls included."""
    out = {}
    for line in server.command("INFO", "commandstats").decode().splitlines():
        if line.startswith("cmdstat_"):
            name, _, rest = line.partition(":")
            fields = dict(f.split("=") for f in rest.split(","))
            out[name + ":"] = float(fields["usec"])
    return out


# The floor of a budget kept in one Lua script per call: Redis server µs per call of a
# plain decision's two commands, of an empty script, and of a script that only reads six
# fields of a hash and writes five (a budget call reads and writes more).
FLOOR_SCRIPTS = {
    "empty_script": "return 1",
    "hash_script": "redis.call('HMGET', KEYS[1], 'a', 'b', 'c', 'd', 'e', 'f') "
    "redis.call('HSET', KEYS[1], 'a', 1, 'b', 2, 'c', 3, 'd', 4, 'e', 5) return 1",
}


def lua_floor(server: Any, n: int) -> dict[str, float]:
    """Server µs per call (INFO commandstats) of INCRBY + EXPIRE and of FLOOR_SCRIPTS."""
    client = server.client()
    out = {}
    client.config_resetstat()
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        pipe.incrby(f"floor{i % 64}", ESTIMATE)
        pipe.expire(f"floor{i % 64}", 3600)
    pipe.execute()
    stats = client.info("commandstats")
    out["incrby_expire"] = (stats["cmdstat_incrby"]["usec"] + stats["cmdstat_expire"]["usec"]) / n
    for name, script in FLOOR_SCRIPTS.items():
        sha = client.script_load(script)
        client.config_resetstat()
        pipe = client.pipeline(transaction=False)
        for i in range(n):
            pipe.evalsha(sha, 1, f"floor-{name}{i % 64}")
        pipe.execute()
        out[name] = client.info("commandstats")["cmdstat_evalsha"]["usec"] / n
    return {name: round(v, 3) for name, v in out.items()}


async def redis_figures(address: str, server: Any, n: int, repeat: int) -> dict[str, Any]:
    """Per call: client µs of CPU, server µs and round trips, with one caller (`1`) and with
    CALLERS concurrent ones (`many`: the backend pipelines what they send at once)."""
    # A generous request timeout: on a loaded shared machine a pipelined round of 64
    # callers' scripts can wait behind other processes (the figures are CPU, not latency).
    settings = RedisSettings(url=address, socket_type="tcp", pool_size=4, request_timeout=10.0)
    backend = RedisBackend(settings)
    await backend.connect()
    clock = Clock(time.time())
    core = build_core(backend=backend, clock=clock)
    core.load(CONFIGS)
    should_rate_limit = core.service.should_rate_limit

    async def decide(request: Request) -> Any:
        clock.t += STEP
        return await should_rate_limit(request)

    runs: dict[str, dict[str, list[float]]] = {
        f"{name}.{callers}": {
            "client_us": [],
            "server_us": [],
            "round_trips": [],
            "scripts_us": [],
        }
        for name in CALLS
        for callers in ("1", "many")
    }

    commands: dict[str, dict[str, float]] = {}  # per call, µs per command (one caller)

    async def caller(requests: list[Request]) -> None:
        for request in requests:
            answer = await decide(request)
            assert answer.overall_code == OK, (request, answer)

    try:
        await decide(Request("llm", [call("reserve", "warm", 1, "w")]))  # loads the script
        warm = Calls(int(WARM / STEP / 2), "warm-")  # the steady state (STEP)
        for request in interleave(warm.reserve, warm.stream_end):
            await decide(request)
        for callers in (1, CALLERS):
            for name, setup, timed, per in batches(n, repeat, f"c{callers}-"):
                for request in setup:
                    await decide(request)
                # Contiguous even slices: a transaction's two calls stay in order.
                size = -(-len(timed) // callers // 2) * 2
                server.command("CONFIG", "RESETSTAT")
                before = settled(core)
                writes = backend.writes
                start = time.process_time()
                await asyncio.gather(
                    *(caller(timed[i : i + size]) for i in range(0, len(timed), size))
                )
                figures = runs[f"{name}.{'1' if callers == 1 else 'many'}"]
                figures["client_us"].append((time.process_time() - start) / per * 1e6)
                figures["round_trips"].append((backend.writes - writes) / per)
                usec = command_usec(server)
                # Every command: an upper bound, as a script's commands are counted in its
                # own figure and again under their names (a budget of fixed windows runs
                # small scripts only on rare paths: `backends/redis/claims.py`).
                spent = sum(v for k, v in usec.items() if k not in NOT_CALLS)
                figures["server_us"].append(spent / per)
                figures["scripts_us"].append(sum(usec.get(k, 0.0) for k in SCRIPTS) / per)
                if callers == 1:
                    commands[name] = {
                        k[len("cmdstat_") : -1]: round(v / per, 3)
                        for k, v in sorted(usec.items())
                        if k not in NOT_CALLS and v
                    }
                check(name, core, before, per)
    finally:
        await backend.close()
    out: dict[str, Any] = {
        name: {k: round(statistics.median(v), 3) for k, v in figures.items()}
        for name, figures in runs.items()
    }
    out["commands"] = commands
    return out


class Streams:
    """Transactions as a running daemon sees them: each call a reserve of a new one or the
    stream end of the one reserved LAG calls earlier (a stream of a minute at STEP), on 64
    users, in one order however many callers take them."""

    def __init__(self) -> None:
        self.made = 0
        self.open: collections.deque[tuple[str, str]] = collections.deque()

    def __next__(self) -> Request:
        if len(self.open) < LAG // 2 or self.made % 2 == 0:
            u, t = f"u{self.made % 64}", f"s{self.made}"
            self.made += 1
            self.open.append((u, t))
            return Request("llm", [call("reserve", t, ESTIMATE, u)])
        u, t = self.open.popleft()
        self.made += 1
        return Request("llm", [call("settle", t, USAGE, u), call("close", t, 200, u)])


async def server_cpu(address: str, server: Any, repeat: int) -> dict[str, Any]:
    """Redis server CPU per call in the steady state, every sweep counted: batches of plain
    decisions (PLAIN calls) and of transactions (Streams, STEADY calls: a sweep period and
    more) alternating, `repeat` of each: one caller on one daemon, CALLERS on one, and
    CALLERS on two daemons (each call to either at random, as Envoy spreads them: a
    settle then finds the reserve's daemon half the time). Per batch the server process's
    CPU (`cpu_us`: reading, parsing, running and replying) and the commands' own time
    (INFO commandstats), per call; medians, and of the ratios."""
    settings = RedisSettings(url=address, socket_type="tcp", pool_size=4, request_timeout=10.0)
    clock = Clock(time.time())
    backends, decide = [], []
    for _ in range(2):
        backend = RedisBackend(settings)
        backends.append(backend)
        await backend.connect()
        core = build_core(backend=backend, clock=clock)
        core.load(CONFIGS)
        decide.append(core.service.should_rate_limit)
    streams = Streams()
    plain = Calls(PLAIN, "p").plain
    pick = random.Random(1).random
    last: dict[str, float] = {}  # the last batch's µs per call of each command

    async def run(
        take: Callable[[], Request], n: int, callers: int, daemons: int
    ) -> tuple[float, float]:
        async def caller(k: int) -> None:
            for _ in range(k):
                clock.t += STEP
                daemon = decide[1 if daemons == 2 and pick() < 0.5 else 0]
                answer = await daemon(take())
                assert answer.overall_code == OK, answer

        server.command("CONFIG", "RESETSTAT")
        cpu = server.cpu_us()
        await asyncio.gather(*(caller(n // callers) for _ in range(callers)))
        spent = server.cpu_us() - cpu
        usec = command_usec(server)
        commands = sum(v for k, v in usec.items() if k not in NOT_CALLS)
        last.clear()
        last.update({k[8:-1]: round(v / n, 3) for k, v in usec.items() if k not in NOT_CALLS})
        return spent / n, commands / n

    out: dict[str, Any] = {}
    try:
        await run(streams.__next__, int(WARM / STEP), 1, 1)
        for callers, daemons in ((1, 1), (CALLERS, 1), (CALLERS, 2)):
            rows: dict[str, list[float]] = collections.defaultdict(list)
            for _ in range(repeat):
                i = iter(itertools.cycle(plain))
                p_cpu, p_cmd = await run(i.__next__, PLAIN, callers, daemons)
                b_cpu, b_cmd = await run(streams.__next__, STEADY, callers, daemons)
                rows["plain_cpu"].append(p_cpu)
                rows["plain_commands"].append(p_cmd)
                rows["budget_cpu"].append(b_cpu)
                rows["budget_commands"].append(b_cmd)
                rows["x_cpu"].append(b_cpu / p_cpu)
                rows["x_commands"].append(b_cmd / p_cmd)
            medians: dict[str, Any] = {k: round(statistics.median(v), 3) for k, v in rows.items()}
            medians["commands"] = dict(sorted(last.items()))
            out[f"{callers} on {daemons}"] = medians
    finally:
        for backend in backends:
            await backend.close()
    return out


def workload(example: str) -> dict[str, int]:
    """The concurrency workload through Envoy on `example`: admitted, charged, overshoot."""
    config = (EXAMPLES / example / "config" / "llm.yaml").read_text()
    config = config.replace("requests_per_unit: 100000", f"requests_per_unit: {LIMIT}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        llm_stack(Path(tmp), example, config, record=False) as s,
    ):
        answers = concurrent_streams(s, STREAMS, max_tokens=MAX_TOKENS, usage=WORKLOAD_USAGE)
        admitted = sum(a.status == 200 for a in answers)
        expected = admitted * WORKLOAD_USAGE
        wait_for(lambda: s.counter("crowd")["value"] == expected, 60, "every stream end")
        if example == "reserve":
            wait_for(lambda: s.counter("crowd")["reserved"] == 0, 60, "every settle")
        used = int(s.counter("crowd")["value"])
    return {"admitted": admitted, "charged": used, "overshoot": max(0, used - LIMIT)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--redis-calls", type=int, default=4_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-envoy", action="store_true", help="skip the Envoy workload")
    parser.add_argument("--baseline", type=Path, help="a source tree measured side by side")
    parser.add_argument("--baseline-label", default="", help="what --baseline is (a commit)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    memory, before = memory_side_by_side(args.calls, args.repeat, args.baseline)
    with tempfile.TemporaryDirectory() as tmp:
        servers = RedisServers(Path(tmp))
        try:
            server = servers()
            redis = uvloop.run(redis_figures(server.address, server, args.redis_calls, args.repeat))
            fresh = servers()  # the steady state from its start, its own warm-up
            steady = uvloop.run(server_cpu(fresh.address, fresh, args.repeat))
            floor = lua_floor(server, args.redis_calls)
        finally:
            servers.stop_all()
    result: dict[str, Any] = {
        "machine": machine_info(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "memory_us": memory,
        "memory_implementation": budget_maths(),
        "redis": redis,
        "redis_server_cpu": steady,
        "redis_floor_server_us": floor,
        # 1, 5, 15-minute load averages before and after the decision figures.
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }
    if before is not None:
        result["baseline"] = {"label": args.baseline_label, "memory_us": before}
    if not args.no_envoy:
        result["workload"] = {
            "streams": STREAMS,
            "max_tokens": MAX_TOKENS,
            "usage": WORKLOAD_USAGE,
            "limit": LIMIT,
            "check_then_report": workload("check-then-report"),
            "reserve": workload("reserve"),
        }
    out = Path(__file__).parent / "results"
    (out / "budget.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "budget.md").write_text(render(result))
    print(render(result))


def budget_maths() -> str:
    """Whether the budget maths run compiled or as their source."""
    return "compiled" if (memory_budget.__file__ or "").endswith(".so") else "source"


def render(result: dict[str, Any]) -> str:
    memory, redis, m = result["memory_us"], result["redis"], result["machine"]
    lines = [
        "# Token budgets (bench/budget.py)",
        "",
        "Command: `.venv/bin/python bench/budget.py` (one run; CPU = time.process_time of the",
        "deciding process, per call through the service; ratios to the plain decision of",
        "this run). Plain: one descriptor `user` (hits 700) on an hourly fixed window; the",
        "budget calls on the same rule with `budget:`. Stream end: settle + close in one call,",
        "as Envoy sends it; transaction: a reserve and its stream end (two calls).",
        "",
        f"Machine: {m.get('cpu')}, Python {m.get('python')}, {m.get('redis-server')}.",
        "Load average (1, 5, 15 min) before and after the decision figures: "
        f"{load_averages(result['load_average'])} (a shared machine).",
        "",
        "Memory: CPU µs per call. Redis, one caller and 64 concurrent ones (auto-pipelined):",
        "client CPU µs per call, Redis server µs per call (INFO commandstats) and round trips",
        "per call (the backend's pipelined writes / calls).",
        "",
    ]
    one, many = redis["plain.1"], redis["plain.many"]
    rows = []
    for name in CALLS:
        r, c = redis[f"{name}.1"], redis[f"{name}.many"]
        x = memory[name]
        rows.append([name, f"{x:.2f}", f"{x / memory['plain']:.2f}", f"{r['client_us']:.1f}"])
        rows[-1] += [f"{r['client_us'] / one['client_us']:.2f}", f"{r['server_us']:.2f}"]
        rows[-1] += [f"{r['server_us'] / one['server_us']:.2f}"]
        rows[-1] += [f"{r['round_trips']:.2f}", f"{c['client_us']:.1f}"]
        rows[-1] += [f"{c['client_us'] / many['client_us']:.2f}", f"{c['round_trips']:.3f}"]
    columns = ("call", "memory µs", "x plain", "Redis µs (1)", "x plain", "server µs", "x plain")
    columns += ("round trips", "Redis µs (64)", "x plain", "round trips (64)")
    lines += table(columns, rows)
    steady = result.get("redis_server_cpu")
    if steady:
        lines += [
            "",
            "**Redis server CPU per call, steady state** (`server_cpu`, every sweep counted):",
            f"batches of {PLAIN} plain decisions and of {STEADY} transaction calls (a reserve,",
            f"and its stream end {LAG} calls later: a stream of a minute) alternate, after",
            f"{WARM} s of them; medians of {result['args']['repeat']}. CPU: the server process's",
            "run time (its threads' schedstat: reading, parsing, running, replying); commands:",
            "their own time only (INFO commandstats). On two daemons each call goes to either",
            "at random, so half the settles come to a daemon that did not make the reserve.",
            "",
        ]
        rows = []
        for callers, r in steady.items():
            rows.append(
                (
                    callers.replace(" on 1", " on one daemon").replace(" on 2", " on two"),
                    f"{r['plain_cpu']:.2f}",
                    f"{r['budget_cpu']:.2f}",
                    f"**{r['x_cpu']:.2f}**",
                    f"{r['plain_commands']:.3f}",
                    f"{r['budget_commands']:.3f}",
                    f"{r['x_commands']:.2f}",
                )
            )
        columns = ("callers", "plain CPU µs", "budget CPU µs", "x plain")
        columns += ("plain commands µs", "budget commands µs", "x plain")
        lines += table(columns, rows)
    f = result["redis_floor_server_us"]
    lines += [
        "",
        "The floor of one Lua script per call, Redis server µs per call on the same server: "
        f"INCRBY + EXPIRE {f['incrby_expire']:.2f}, an empty script {f['empty_script']:.2f}, "
        f"a script reading six hash fields and writing five {f['hash_script']:.2f}.",
    ]
    lines += [
        "",
        "The budget is kept in plain commands (`backends/redis/claims.py`: fixed windows, no",
        "outbox). Server µs per call of each command, one caller (EVALSHA: the small scripts",
        "of rare paths, e.g. raising the budget's `e` once per window, whose commands are",
        "also counted under their names):",
        "",
    ]
    for name, commands in redis.get("commands", {}).items():
        lines.append(f"- {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in commands.items()))
    base = result.get("baseline")
    if base:
        b = base["memory_us"]
        lines += [
            "",
            f"Memory, before ({base['label']}) and after (this tree, budget maths "
            f"{result['memory_implementation']}), alternating run by run in this run:",
            "",
        ]
        rows = []
        for name in CALLS:
            x, y = b[name], memory[name]
            rows.append(
                (name, *(f"{v:.2f}" for v in (x, x / b["plain"], y, y / memory["plain"], y / x)))
            )
        columns = ("call", "before µs", "x plain", "after µs", "x plain", "after / before")
        lines += table(columns, rows)
    w = result.get("workload")
    if w:
        lines += [
            "",
            f"Workload through Envoy: {w['streams']} concurrent streams, max_tokens "
            f"{w['max_tokens']}, usage {w['usage']}, limit {w['limit']} tokens per hour.",
            "",
        ]
        lines += table(
            ("example", "admitted", "charged", "overshoot"),
            (
                (
                    name.replace("_", "-"),
                    w[name]["admitted"],
                    w[name]["charged"],
                    f"{w[name]['overshoot']} "
                    f"({100 * w[name]['overshoot'] / w['limit']:.0f}% of the limit)",
                )
                for name in ("check_then_report", "reserve")
            ),
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
