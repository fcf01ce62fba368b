"""File descriptors for clients, and what is kept in reserve.

21,000 idle TCP connections once used up the process's open-file limit: `/healthcheck`
failed, new gRPC connections hung and the debug port died. So at start the soft
RLIMIT_NOFILE is raised to its hard limit, and every listener admits a client only while
all of them together hold fewer than that limit less FD_RESERVE descriptors: config reloads,
backend connections, logs and the health check always find one. Each listener also has its
own cap (settings.ConnectionLimits), and none takes more than half of the budget. A client
past either is accepted and closed at once (the kernel has already completed its handshake),
which costs one descriptor for a moment.
"""

from __future__ import annotations

import logging
import resource
import time

log = logging.getLogger("ratelimitd")

# Descriptors no client connection may take: config files, Redis/memcached pools, the stats
# sink, xDS, logs, and the listeners themselves.
FD_RESERVE = 256
# At most one "refused" log line per this many seconds (a flood must not flood the log).
_LOG_EVERY = 10.0


def raise_nofile() -> int:
    """Raise the soft open-file limit to the hard one; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft


class ConnectionBudget:
    """Client connections of every listener of this process, together."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.open = 0
        self.refused = 0
        self._logged = 0.0

    @classmethod
    def for_process(cls) -> ConnectionBudget:
        """The budget of a process whose soft RLIMIT_NOFILE was just raised."""
        return cls(max(16, raise_nofile() - FD_RESERVE))

    def admit(self, listener: str, held: int, cap: int) -> bool:
        """Take one connection for `listener` (holding `held` of its `cap`), or refuse it.

        No listener takes more than half the budget: a flood on one (idle HTTP connections,
        say) leaves the other half to the others (Envoy's gRPC connections, say).
        """
        if held < cap and held < self.total // 2 and self.open < self.total:
            self.open += 1
            return True
        self.refused += 1
        now = time.monotonic()
        if now - self._logged >= _LOG_EVERY:
            self._logged = now
            log.warning(
                "refusing %s connections: %d of its %d held, %d of %d for all listeners "
                "(%d refused so far)",
                listener,
                held,
                cap,
                self.open,
                self.total,
                self.refused,
            )
        return False

    def release(self) -> None:
        """Give back a connection `admit` took."""
        self.open -= 1
