"""The Redis counter path's codec and round: the compiled leaves `_resp` agree with their pure
twin `_resp_py` (the oracle), and both say what Redis reads; the round, `rounds.py` (one
source), does the same compiled and run by the interpreter.

The payload of a request's ops parses, with hiredis, as INCRBY + EXPIRE per op in order;
`resolve` hands every waiter of a flush the same results and counts the same breaker
verdicts compiled and uncompiled; a round on a connection (`written`, then `received`
however the replies are cut) leaves the same state and answers the same waiters, whichever
build of the round and whichever parser twin.
"""

from __future__ import annotations

import asyncio
import importlib.util
import socket
from types import ModuleType
from typing import Any

import hiredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimitd.backends.base import BackendError, Op
from ratelimitd.backends.redis import _resp_py, resp, rounds
from ratelimitd.backends.redis.pool import Counters, Dialer, Pool
from ratelimitd.backends.redis.resp import RespConnection
from ratelimitd.settings import RedisSettings

_resp = pytest.importorskip(
    "ratelimitd.backends.redis._resp", reason="compiled extension not built"
)

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TWINS = [_resp_py, _resp]


def uncompiled(module: ModuleType) -> ModuleType:
    """`module`'s source (a Cython pure-Python-mode module, compiled in a normal install) run
    by the interpreter, as it runs where the extension is not built."""
    source = module.__name__.rpartition(".")[2] + ".py"
    path = module.__file__.rsplit("/", 1)[0] + "/" + source  # type: ignore[union-attr]
    spec = importlib.util.spec_from_file_location(f"{module.__name__}_source", path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


# The round, as imported (compiled in a normal install) and from its source, uncompiled.
ROUNDS = [rounds, uncompiled(rounds)]

KEYS = st.text(min_size=0, max_size=300)
FIXED = st.builds(
    Op,
    KEYS,
    st.one_of(st.integers(0, 4100), st.integers(0, 2**40), st.integers(-(2**63), 2**63 - 1)),
    st.one_of(st.integers(1, 4000), st.integers(-(2**62), 2**62)),
)


def commands(payload: bytes) -> list[list[bytes]]:
    reader = hiredis.Reader()
    reader.feed(payload)
    out = []
    while (command := reader.gets()) is not False:
        out.append(command)
    return out


@PROPS
@given(st.lists(FIXED, min_size=1, max_size=12))
def test_payload_twins_agree_and_redis_reads_each_op(ops: list[Op]) -> None:
    payload = _resp.incrby_expire_ops(ops, 0)
    assert payload == _resp_py.incrby_expire_ops(ops, 0)
    expected = []
    for op in ops:
        key = op.key.encode()
        expected.append([b"INCRBY", key, b"%d" % op.hits])
        expected.append([b"EXPIRE", key, b"%d" % op.seconds])
    assert commands(payload) == expected


@pytest.mark.parametrize("twin", TWINS)
def test_jitter_stays_below_its_bound(twin: Any) -> None:
    for _ in range(200):
        (_, expire) = commands(twin.incrby_expire_ops([Op("k", 1, 60)], 5))
        assert 60 <= int(expire[2]) < 65


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize(
    "script",
    [
        Op("s", 1, 60, algorithm=1, tick=1000),
        Op("r", 2, 60, refund=True),
        Op("b", 5, 0, budget=object()),  # a token-budget call (its script)
    ],
)
def test_a_scripts_op_is_not_encoded(twin: Any, script: Op) -> None:
    assert twin.incrby_expire_ops([Op("k", 1, 60), script], 0) is None


class Waiter:
    def __init__(self, cancelled: bool = False) -> None:
        self.cancelled = cancelled
        self.results: list[Any] = []

    def __call__(self, results: Any) -> None:
        self.results.append(results)


class Breaker:
    def __init__(self) -> None:
        self.failures = 5
        self.verdicts: list[str] = []

    def failed(self) -> None:
        self.verdicts.append("failed")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "failures" and hasattr(self, "verdicts"):
            self.verdicts.append(f"failures={value}")
        object.__setattr__(self, name, value)


def counts(replies: list[Any], offset: int, n: int) -> list[Any]:
    """The instance's slow path: a saturated INCRBY reads high, anything else fails."""
    out = []
    for i in range(offset, offset + n, 2):
        if replies[i + 1].__class__ is not int or replies[i] == b"boom":
            raise BackendError(f"bad reply at {i}")
        out.append(replies[i] if replies[i].__class__ is int else 2**63 - 1)
    return out


def outcome(round_: Any, replies: Any, layout: list[tuple[int, bool]]) -> tuple[list, list]:
    waiters, entries, offset = [], [], 0
    for n, cancelled in layout:
        waiter = Waiter(cancelled)
        waiters.append(waiter)
        entries += (waiter, offset, n)
        offset += n
    breaker = Breaker()
    round_.resolve(replies, entries, breaker, counts)
    seen = [
        [r if r.__class__ is not BackendError else ("error", r.args) for r in w.results]
        for w in waiters
    ]
    return seen, breaker.verdicts


REPLY = st.one_of(st.integers(0, 2**63 - 1), st.just(b"overflow"), st.just(b"boom"))


@PROPS
@given(st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=1, max_size=6), st.data())
def test_resolve_compiled_and_uncompiled_agree(
    layout: list[tuple[int, bool]], data: st.DataObject
) -> None:
    layout = [(2 * n, cancelled) for n, cancelled in layout]
    total = sum(n for n, _ in layout)
    replies = data.draw(st.lists(REPLY, min_size=total, max_size=total))
    compiled, source = ROUNDS
    assert outcome(compiled, replies, layout) == outcome(source, replies, layout)
    failed = BackendError("redis request timed out")
    compiled, verdicts = outcome(compiled, failed, layout)
    assert (compiled, verdicts) == outcome(source, failed, layout)
    assert compiled == [[("error", ("redis request timed out",))]] * len(layout)
    assert verdicts == ["failed"] * sum(not cancelled for _, cancelled in layout)


@pytest.mark.parametrize("round_", ROUNDS)
def test_resolve_gives_each_waiter_its_own_counters(round_: Any) -> None:
    seen, verdicts = outcome(
        round_, [7, 1, 3, 1, b"overflow", 1, 5, b"boom"], [(4, False), (4, True)]
    )
    assert seen == [[[7, 3]], [("error", ("bad reply at 6",))]]
    assert verdicts == ["failures=0"]  # the cancelled waiter counts neither way


@pytest.mark.parametrize("round_", ROUNDS)
def test_a_flush_delivered_to_a_resolver_resolves_with_the_instances_breaker(round_: Any) -> None:
    class Instance:
        breaker = Breaker()
        _counts = staticmethod(counts)

    waiter = Waiter()
    flush = round_.Flush(None, round_.Resolver(Instance()))
    flush.entries = [waiter, 0, 4]
    flush.deliver([7, 1, b"overflow", 1])
    assert flush.done() and waiter.results == [[7, 2**63 - 1]]
    assert Instance.breaker.verdicts == ["failures=0"]


def test_the_round_from_its_source_is_not_the_compiled_one() -> None:
    assert ROUNDS[1].__file__.endswith("rounds.py") and ROUNDS[1].Flush is not rounds.Flush


def test_the_selected_twin_is_the_compiled_one_unless_disabled() -> None:
    assert resp.incrby_expire_ops in (_resp.incrby_expire_ops, _resp_py.incrby_expire_ops)
    assert resp.implementation("pure") is _resp_py
    assert resp.implementation("compiled") is _resp


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("round_", ROUNDS)
def test_read_replies_takes_what_came_and_says_whether_all_did(round_: Any, twin: Any) -> None:
    read_replies = round_.read_replies
    replies_of = twin.Replies()
    replies_of.feed(b":1\r\n:2\r\n:3\r\n-ERR no\r\n:4")  # the last reply not whole yet
    replies: list[Any] = [0]
    assert read_replies(replies_of, replies, 2) is True
    assert replies == [0, 1, 2]
    assert read_replies(replies_of, replies, 3) is False
    assert replies[:3] == [0, 1, 2] and replies[3] == 3 and len(replies) == 5
    assert isinstance(replies[4], hiredis.ReplyError)
    replies_of.feed(b"\r\n")
    assert read_replies(replies_of, replies, 1) is True and replies[5] == 4
    assert read_replies(replies_of, replies, 0) is True


# Replies as Redis sends them, and a few it never does (the parsers must refuse those alike).
REPLY_BYTES = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(lambda n: b":%d\r\n" % n),
    st.integers(0, 3).map(lambda n: b":%d\r\n" % n),
    st.just(b"-ERR value is not an integer or out of range\r\n"),
    st.just(b"+OK\r\n"),
    st.binary(max_size=12).map(lambda b: b"$%d\r\n%b\r\n" % (len(b), b)),
    st.just(b"$-1\r\n"),
    st.just(b"*2\r\n:7\r\n$1\r\nx\r\n"),
    st.just(b"*1\r\n*1\r\n:-5\r\n"),
    st.sampled_from([b":\r\n", b":-\r\n", b":12a\r\n", b":1\n", b"?x\r\n"]),
)


def parsed(parser: Any, stream: bytes, cuts: list[int]) -> list[Any]:
    """Every reply `parser` gives for `stream` read in pieces cut at `cuts`, and how it ended."""
    out: list[Any] = []
    start = 0
    try:
        for cut in [*sorted(cuts), len(stream)]:
            parser.feed(stream[start:cut])
            start = cut
            while (reply := parser.gets()) is not False:
                error = isinstance(reply, hiredis.ReplyError)
                out.append(("error", str(reply)) if error else reply)
    except hiredis.ProtocolError:
        out.append("protocol error")
    return out


@PROPS
@given(st.lists(REPLY_BYTES, min_size=1, max_size=30), st.data())
def test_replies_twins_agree(replies: list[bytes], data: st.DataObject) -> None:
    # The compiled parser reads integers itself and hands hiredis the rest: the same
    # replies, cut anywhere by the reads, and the same refusal of a malformed stream.
    stream = b"".join(replies)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    assert parsed(_resp.Replies(), stream, cuts) == parsed(_resp_py.Replies(), stream, cuts)


def pool_after(twin: Any, sizes: list[int], limit: int) -> list[tuple[Any, ...]]:
    """What a pool holds after each request (`sizes`: ops per request) a twin's `Sender`
    handed it: the flush being built (its commands, payloads and waiters) and the flushes
    written so far. The pool's one connection has no transport: a flush written to it
    fails, which the loop (never run here) would tell its waiters."""
    loop = asyncio.new_event_loop()
    try:
        settings = RedisSettings(pipeline_limit=limit)
        pool = Pool(settings, Dialer(settings, None), _no_address, Counters(_nothing), "t", 64)
        pool.loop = loop
        pool.conns.append(RespConnection(loop, 1.0))
        send = twin.Sender(pool, 0)
        seen = []
        for i, size in enumerate(sizes):
            ops = [Op(f"k{i}.{j}", 1, 60) for j in range(size)]
            assert send(ops, f"waiter {i}") is True
            fut = pool._fut
            entries = None if fut is None else list(fut.entries or ())
            seen.append((pool._cmds, b"".join(pool._buf), entries, pool.writes))
        assert send([Op("s", 1, 60, algorithm=1, tick=1000)], "script") is False
        return seen
    finally:
        loop.close()


async def _no_address() -> Any:
    raise AssertionError("never dialled")


def _nothing() -> None:
    pass


@PROPS
@given(st.lists(st.integers(1, 5), min_size=1, max_size=40), st.sampled_from([0, 6, 11]))
def test_sender_twins_agree(sizes: list[int], limit: int) -> None:
    # The compiled one joins the flush being built in C; the pure one calls Pool.submit for
    # every request. Both leave the pool alike, the flushes split at the same requests.
    assert pool_after(_resp, sizes, limit) == pool_after(_resp_py, sizes, limit)


@pytest.mark.parametrize("twin", TWINS)
def test_sender_refuses_without_a_connection(twin: Any) -> None:
    settings = RedisSettings()
    pool = Pool(settings, Dialer(settings, None), _no_address, Counters(_nothing), "t", 64)
    with pytest.raises(BackendError, match="no connection"):
        twin.Sender(pool, 0)([Op("k", 1, 60)], "waiter")


# -- a round on a connection: `written` then `received`, compiled and not, either parser -----

# Six integer replies: a batch of two, then a flush of four; sent in any cut.
REPLIES = b":1\r\n:1\r\n:2\r\n:1\r\n:3\r\n:0\r\n"


async def a_round(round_: Any, twin: Any, cuts: list[int]) -> dict[str, Any]:
    """Write one flush of two batches on a real socket with `round_.written`, read its
    replies back cut at `cuts` with `round_.received` (through `twin`'s parser): what was
    sent, the connection's state, and what each batch's waiter got (the second batch is a
    `Flush` whose waiters get their replies where they are read, as the pool's are)."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    theirs.settimeout(5)
    transport, conn = await loop.create_connection(lambda: RespConnection(loop, 5.0), sock=ours)
    try:
        conn._reader = twin.Replies()
        delivered: list[Any] = []
        flush = round_.Flush(loop, lambda replies, entries: delivered.append((replies, entries)))
        flush.entries = ["waiter", 0, 4]
        plain = loop.create_future()
        batches = [round_.Batch(plain, 2), round_.Batch(flush, 4)]
        round_.written(conn, b"*1\r\n$4\r\nPING\r\n", batches, 6)
        sent = theirs.recv(100)
        after_write = (conn.in_flight, conn.writes, len(conn.pending), conn._timer is not None)
        state = []
        start = 0
        for cut in [*cuts, len(REPLIES)]:
            round_.received(conn, REPLIES[start:cut])
            start = cut
            state.append((conn.in_flight, len(conn.pending), plain.done(), len(delivered)))
        return {
            "sent": sent,
            "after write": after_write,
            "as replies came": state,
            "plain": plain.result(),
            "flush": (flush.done(), delivered),
        }
    finally:
        transport.close()
        theirs.close()


@pytest.mark.parametrize("cuts", [[], [3], [8, 9], [4, 8, 12, 16, 20]])
async def test_a_round_agrees_compiled_and_uncompiled_with_either_parser(cuts: list[int]) -> None:
    compiled = await a_round(rounds, _resp, cuts)
    for round_, twin in [(rounds, _resp_py), (ROUNDS[1], _resp), (ROUNDS[1], _resp_py)]:
        assert await a_round(round_, twin, cuts) == compiled
    pure = await a_round(ROUNDS[1], _resp_py, cuts)
    assert pure["sent"] == b"*1\r\n$4\r\nPING\r\n"
    assert pure["after write"] == (6, 1, 2, True)
    assert pure["plain"] == [1, 1]
    assert pure["flush"] == (True, [([2, 1, 3, 0], ["waiter", 0, 4])])
    assert pure["as replies came"][-1] == (0, 0, True, 1)


@pytest.mark.parametrize("round_", ROUNDS)
async def test_a_failed_flush_reaches_its_waiters_from_the_loop(round_: Any) -> None:
    loop = asyncio.get_running_loop()
    delivered: list[Any] = []
    flush = round_.Flush(loop, lambda result, entries: delivered.append(result))
    flush.entries = ["waiter", 0, 2]
    failure = BackendError("redis request timed out")
    flush.set_result(failure)
    assert flush.done() and delivered == []  # not inside the call that failed it
    await asyncio.sleep(0)
    assert delivered == [failure]


@pytest.mark.parametrize("round_", ROUNDS)
async def test_a_write_on_a_closed_connection_fails_its_batches(round_: Any) -> None:
    loop = asyncio.get_running_loop()
    conn = RespConnection(loop, 5.0)  # never connected: no transport
    plain = loop.create_future()
    round_.written(conn, b"*1\r\n$4\r\nPING\r\n", [round_.Batch(plain, 1)], 1)
    error = plain.result()
    assert isinstance(error, BackendError) and error.args == ("redis connection closed",)
    assert (conn.in_flight, conn.writes, len(conn.pending)) == (0, 0, 0)


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("round_", ROUNDS)
async def test_a_reply_nobody_asked_for_aborts_the_connection(round_: Any, twin: Any) -> None:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    transport, conn = await loop.create_connection(lambda: RespConnection(loop, 5.0), sock=ours)
    try:
        conn._reader = twin.Replies()
        round_.received(conn, b":1\r\n")
        assert transport.is_closing() and conn.local_close
    finally:
        transport.close()
        theirs.close()
