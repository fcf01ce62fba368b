"""Where a budget script's Redis server CPU goes: the script of this tree against another
tree's, and the cost of the script cut short at each of its steps.

    .venv/bin/python bench/budget_lua.py [--calls 3000] [--repeat 3] [--baseline REV]

On one redis-server (started on a free port), the budget script (`backends.redis.budget`)
is called as the daemon calls it (EVALSHA, one hourly fixed window, 64 budgets, a fresh
transaction per call): a reserve, a settle of it, a close of the settled transaction (a
call that writes nothing). Per call: server µs of EVALSHA (INFO commandstats, the script's
own commands included) and of the commands the script called; the least of --repeat runs
(the machine may be shared). With --baseline, the script of git revision REV is measured
in the same run, alternating with this tree's.

Then the steps of this tree's script: the script returning early at each marked line (on
budgets a full run has filled, so that each call takes the path of the figures above),
whose differences are what each step costs.

Writes bench/results/budget_lua.json and budget_lua.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from support.machine import machine_info
from support.redis_server import RedisServers
from support.report import table

from ratelimitd.backends.redis.budget import BUDGET_LUA
from ratelimitd.config.budget_store import RELEASE, RESERVE, SETTLE, SWEEP_BATCH, USED_MAX
from ratelimitd.config.windows import FIXED_WINDOW

CALLS = (("reserve", RESERVE, 700), ("settle", SETTLE, 500), ("close", RELEASE, 200))
TTL = 600_000
# Lines of this tree's script the step figures stop before (the first words of each).
STEPS = (
    ("the call itself (its keys, arguments and reply)", "local H, Z"),
    ("+ reading the arguments", "-- `e`, `d`"),
    ("+ the HMGET's field names", "local got = redis.call('HMGET'"),
    ("+ HMGET", "local e = tonumber(got[1])"),
    ("+ rolling the windows", "local records = {}"),
    ("+ its helpers, and the sweep when one is due", "if kind ~= COUNT and records[txn]"),
    ("+ the transaction's record parsed", "-- A new id's record"),
    ("+ the bound (ZCARD)", "local function level("),
    ("+ the call's maths (and a reserve's or settle's ZADD)", "-- A settle, or a close"),
    ("+ the writes (HSET, TTLs when due): the whole script", None),
)
EARLY = "do return {0, 0, 0, 0, 0, 0, 1, 1} end\n"


def baseline_script(rev: str) -> str:
    """The budget script of git revision `rev`, its constants written in as its module
    writes them (the same names in every revision)."""
    source = subprocess.run(
        ["git", "show", f"{rev}:ratelimitd/backends/redis/budget.py"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    body = source.split('BUDGET_LUA = (\n    """', 1)[1].split('"""', 1)[0]
    return (
        body.replace("USED_MAX", str(USED_MAX))
        .replace("SWEEP_BATCH", str(SWEEP_BATCH))
        .replace("FIXED_WINDOW", str(FIXED_WINDOW))
    )


def usec(client: Any) -> dict[str, float]:
    stats = client.info("commandstats")
    return {k[len("cmdstat_") :]: float(v["usec"]) for k, v in stats.items()}


def run(client: Any, script: str, n: int, tag: str) -> dict[str, dict[str, float]]:
    """Server µs per call of each of CALLS (n calls each, in order, one transaction per
    reserve): the script's whole (`server`) and its commands' (`commands`)."""
    sha = client.script_load(script)
    now = int(time.time() * 1000)
    out = {}
    for name, kind, amount in CALLS:
        client.config_resetstat()
        pipe = client.pipeline(transaction=False)
        for i in range(n):
            key = f"bench:{{{i % 64}}}llm_user_u{i % 64}_budget"
            pipe.evalsha(
                sha, 2, key, key + "_due",
                kind, now, f"{tag}{i}", amount, TTL, 1, 100_000, 1,
                "3600s", FIXED_WINDOW, 3600, 1000, 2**31,
            )  # fmt: skip
        for reply in pipe.execute(raise_on_error=True):
            assert isinstance(reply, list), reply
        stats = usec(client)
        inner = sum(v for k, v in stats.items() if k not in ("evalsha", "config|resetstat"))
        out[name] = {"server": stats["evalsha"] / n, "commands": inner / n}
    return out


def least(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per call, the run of least server µs."""
    return {name: min((r[name] for r in runs), key=lambda f: f["server"]) for name, *_ in CALLS}


def steps(client: Any, n: int, repeat: int) -> list[tuple[str, dict[str, float]]]:
    """Server µs per call of this tree's script cut short before each of STEPS."""
    out = []
    for label, line in STEPS:
        script = BUDGET_LUA
        if line is not None:
            at = BUDGET_LUA.index(line)
            script = BUDGET_LUA[:at] + EARLY + BUDGET_LUA[at:]
        runs = []
        for r in range(repeat):
            client.flushall()
            run(client, BUDGET_LUA, n, f"s{r}-")  # full budgets, each call's path as above
            runs.append(run(client, script, n, f"s{r}-x"))
        out.append((label, {name: f["server"] for name, f in least(runs).items()}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", help="a git revision whose script is measured too")
    args = parser.parse_args()
    scripts = {"this tree": BUDGET_LUA}
    if args.baseline:
        scripts = {args.baseline: baseline_script(args.baseline), **scripts}
    with tempfile.TemporaryDirectory() as tmp:
        servers = RedisServers(Path(tmp))
        try:
            client = servers().client()
            runs: dict[str, list[Any]] = {label: [] for label in scripts}
            for r in range(args.repeat):
                for label, script in scripts.items():
                    client.flushall()
                    runs[label].append(run(client, script, args.calls, f"r{r}-"))
            compared = {label: least(r) for label, r in runs.items()}
            cut = steps(client, args.calls, args.repeat)
        finally:
            servers.stop_all()
    result = {"machine": machine_info(), "args": vars(args), "scripts": compared, "steps": cut}
    out = Path(__file__).parent / "results"
    (out / "budget_lua.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "budget_lua.md").write_text(render(result))
    print(render(result))


def render(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Where a budget script's server CPU goes (bench/budget_lua.py)",
        "",
        "Command: `.venv/bin/python bench/budget_lua.py"
        + (f" --baseline {result['args']['baseline']}`" if result["args"]["baseline"] else "`")
        + f" (one run; the least of {result['args']['repeat']} runs of "
        f"{result['args']['calls']} calls; a shared machine).",
        f"Machine: {m.get('cpu')}, {m.get('redis-server')}.",
        "",
        "Redis server µs per call (INFO commandstats): the script's whole, and of it the",
        "commands it called (the rest is its Lua).",
        "",
    ]
    lines += table(
        ["script", "call", "server µs", "its commands µs", "Lua µs"],
        [
            (
                label,
                name,
                *(f"{x:.2f}" for x in (f["server"], f["commands"], f["server"] - f["commands"])),
            )
            for label, calls in result["scripts"].items()
            for name, f in calls.items()
        ],
        align="llrrr",
    )
    lines += [
        "",
        "This tree's script returning early, server µs per call (each row adds a step):",
        "",
    ]
    lines += table(
        ["up to", "reserve", "settle", "close"],
        [
            (label, *(f"{f[k]:.2f}" for k in ("reserve", "settle", "close")))
            for label, f in result["steps"]
        ],
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
