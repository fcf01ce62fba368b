"""DOMAIN_DEFAULT_ALGORITHMS through a real Envoy (both gRPC transports): a domain whose
limits name no algorithm counts them by the one the setting gives it. Here a sliding window
at a window boundary: a burst at the end of one second and another at the start of the
next admit at most L + L x (the part of the new second that has passed), where a fixed
window admits 2L."""

from __future__ import annotations

import math
import time

from support import wait_for

from .conftest import DOMAIN, Stack
from .test_envoy import CONFIG as HOURLY

LIMIT = 10  # per second
# test_envoy's config with the user's limit per second.
CONFIG = HOURLY.replace(
    "{unit: hour, requests_per_unit: 3}", f"{{unit: second, requests_per_unit: {LIMIT}}}"
)


def burst(s: Stack, user: str) -> int:
    """LIMIT requests of `user` through Envoy, one after another; how many passed."""
    return sum(s.envoy.request("/", {"x-user-id": user}).status == 200 for _ in range(LIMIT))


def test_a_domain_default_algorithm_makes_bursts_at_a_boundary_slide(stack) -> None:
    s = stack(CONFIG, DOMAIN_DEFAULT_ALGORITHMS=f"{DOMAIN}=sliding_window")
    status, dump = s.daemon.debug("/rlconfig")
    assert status == 200
    assert (
        f"{DOMAIN}.generic_key_edge.user: unit=SECOND requests_per_unit={LIMIT} "
        "algorithm=sliding_window" in dump.decode()
    )
    # The first burst late in a second (it may straddle the boundary: then the bound below
    # only grows with it), the second as soon as the next second starts.
    wait_for(lambda: time.time() % 1 > 0.5, 5, "the second half of a second")
    first = burst(s, "ann")
    boundary = math.floor(time.time()) + 1.0
    wait_for(lambda: time.time() >= boundary, 5, "the next second")
    second = burst(s, "ann")
    overlap = time.time() - boundary  # of the new one-second window, at the last request
    assert first + second <= LIMIT + math.ceil(LIMIT * overlap)
    assert first >= 1 and s.envoy.request("/", {"x-user-id": "bob"}).status == 200
