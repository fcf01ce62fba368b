"""The response-time Timer added to the stats store for the sinks."""

from __future__ import annotations

from ratelimitd.stats import StatsStore, Timer


def test_buckets_are_upper_inclusive() -> None:
    timer = Timer("t")
    timer.set_bounds((5.0, 10.0))
    for ms in (0.1, 5.0, 5.1, 10.0, 11.0):
        timer.observe(ms)
    assert timer.buckets == [2, 2, 1]
    assert timer.count == 5
    assert abs(timer.sum - 31.2) < 1e-9


def test_reservoir_keeps_a_bounded_uniform_sample() -> None:
    timer = Timer("t", capacity=100)
    for i in range(10_000):
        timer.observe(float(i))
    sample, seen = timer.drain()
    assert seen == 10_000 and len(sample) == 100
    # Uniform over the whole stream, not just its head.
    assert max(sample) > 5_000
    assert timer.drain() == ([], 0)
    assert timer.count == 10_000  # totals are not reset by a drain


def test_capacity_zero_keeps_only_totals() -> None:
    timer = Timer("t", capacity=0)
    timer.observe(1.0)
    assert timer.drain() == ([], 1)
    assert timer.count == 1


def test_store_keeps_one_timer_per_name_and_lists_gauges() -> None:
    stats = StatsStore()
    assert stats.timers() == []
    assert stats.timer("a") is stats.timer("a")
    assert [t.name for t in stats.timers()] == ["a"]
    stats.add_gauge("g", lambda: 1)
    assert stats.gauge_names() == frozenset({"g"})
    assert "a" not in stats.snapshot()  # timers are not counters
