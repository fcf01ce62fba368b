"""`Outage`: the state of one dependency (ratelimitd, a store) as seen by one worker, logged
once when it goes and once when it comes back, never per request."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("sidecars.outage")


class Outage:
    """Tracks whether `name` answers; logs each transition once (WARNING down, INFO back)."""

    def __init__(
        self, name: str, consequence: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.consequence = consequence  # what the worker does meanwhile, for the log line
        self.clock = clock
        self.since: float | None = None  # when the current outage started
        self.outages = 0

    @property
    def down(self) -> bool:
        """True during an outage."""
        return self.since is not None

    def failed(self, reason: str) -> None:
        """A call failed: the outage starts now unless it already had."""
        if self.since is None:
            self.since = self.clock()
            self.outages += 1
            log.warning("%s unavailable (%s); %s", self.name, reason, self.consequence)

    def answered(self, detail: str = "") -> float | None:
        """A call succeeded: the outage (if any) ends; its length in seconds."""
        if self.since is None:
            return None
        lasted = self.clock() - self.since
        self.since = None
        log.warning("%s back after %.1f s%s", self.name, lasted, f"; {detail}" if detail else "")
        return lasted
