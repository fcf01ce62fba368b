"""The fair-share arithmetic of RLQS assignments (ratelimitd.quota.share) and the bucket
to descriptor mapping (ratelimitd.quota.buckets): pure functions, checked by example and by
property."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratelimitd.messages import Bounds
from ratelimitd.quota.buckets import BucketError, BucketKeys
from ratelimitd.quota.share import demand, shares, smoothed, wanted


def test_demand_takes_a_report_as_at_least_one_second() -> None:
    # Envoy 1.40 sends whole seconds, and 0s in first reports.
    assert demand(1, 0, 0.0) == 1.0
    assert demand(30, 20, 5.0) == 10.0
    assert smoothed(None, 4.0) == 4.0
    assert smoothed(4.0, 0.0) == 2.0


def test_wanted_is_what_the_demand_uses_over_the_horizon_and_at_least_one() -> None:
    assert wanted(0.0, 10.0) == 1
    assert wanted(1.0, 10.0) == 10
    assert wanted(0.25, 10.0) == 3


def test_everyone_gets_its_want_when_all_fit() -> None:
    assert shares(100, {"a": 90, "b": 10}, {"a": 9.0, "b": 1.0}) == {"a": 90, "b": 10}


def test_a_short_supply_is_split_by_demand() -> None:
    assert shares(20, {"a": 90, "b": 10}, {"a": 9.0, "b": 1.0}) == {"a": 18, "b": 2}
    # Remainders go one by one to the heaviest.
    assert shares(7, {"a": 5, "b": 5, "c": 5}, {"a": 1.0, "b": 1.0, "c": 1.0}) == {
        "a": 3, "b": 2, "c": 2,
    }  # fmt: skip


def test_what_a_capped_stream_leaves_goes_to_the_others() -> None:
    assert shares(20, {"a": 100, "b": 2}, {"a": 1.0, "b": 1.0}) == {"a": 18, "b": 2}


def test_nothing_left_nothing_given() -> None:
    assert shares(0, {"a": 5}, {"a": 1.0}) == {"a": 0}
    assert shares(-3, {"a": 5}, {"a": 1.0}) == {"a": 0}


@given(
    available=st.integers(-10, 1000),
    streams=st.dictionaries(
        st.integers(0, 20),
        st.tuples(st.integers(0, 500), st.floats(0, 1000, allow_nan=False)),
        max_size=12,
    ),
)
def test_the_sum_never_exceeds_what_is_left_and_no_one_gets_more_than_it_wants(
    available: int, streams: dict[int, tuple[int, float]]
) -> None:
    wants = {k: w for k, (w, _) in streams.items()}
    weights = {k: r for k, (_, r) in streams.items()}
    out = shares(available, wants, weights)
    assert sum(out.values()) <= max(available, 0)
    assert all(0 <= out[k] <= wants[k] for k in wants)
    # Nothing is withheld: either every want is met or everything is given out.
    assert sum(out.values()) == min(max(available, 0), sum(wants.values()))


def test_bucket_keys_follow_the_configured_order_then_name_order() -> None:
    keys = BucketKeys(("name", "user"))
    bounds = Bounds()
    assert keys.entries({"user": "u", "zone": "z", "name": "n", "app": "a"}, bounds) == (
        ("name", "n"), ("user", "u"), ("app", "a"), ("zone", "z"),
    )  # fmt: skip
    assert BucketKeys().entries({"b": "2", "a": "1"}, bounds) == (("a", "1"), ("b", "2"))


@pytest.mark.parametrize(
    ("bucket", "error"),
    [
        ({}, "a bucket_id with no entries"),
        ({"user": ""}, "a bucket_id entry with an empty key or value: 'user'"),
        ({"k": "v" * 17}, "a descriptor value of 17 bytes (MAX_DESCRIPTOR_VALUE_LENGTH=16)"),
        (
            {str(i): "v" for i in range(3)},
            "a descriptor with 3 entries (MAX_ENTRIES_PER_DESCRIPTOR=2)",
        ),
    ],
)
def test_malformed_buckets_are_refused_with_the_reason(bucket: dict[str, str], error: str) -> None:
    with pytest.raises(BucketError) as err:
        BucketKeys().entries(bucket, Bounds(max_entries=2, max_value_length=16))
    assert str(err.value) == error
