"""Statistics: the in-process store every counter lives in, and the sinks that export it.

* ``store.py``: `StatsStore` (counters and gauges by their emitted names, the reference's),
  `RuleStats` (the six counters of one rule), `Timer` (response times for the sinks);
* ``sinks.py``: `create_sink(settings, stats)`, the reference's choice among
* ``statsd.py`` (TCP or UDP), ``dogstatsd.py`` (UDP), ``stdout.py`` (gostats' logging sink) and
  ``prometheus.py`` (the text exposition over HTTP, with ``mapper.py`` for the names and
  ``workershare.py`` for RATELIMITD_WORKERS > 1), all built on ``base.py``.

Data flows one way: requests increment the store's attributes; sinks read `snapshot()`
from the event loop. Importing this package imports the store only.
"""

from .store import RULE_STATS, RuleStats, ServiceStats, StatsStore, Timer, sanitize_stat_name

__all__ = ["RULE_STATS", "RuleStats", "ServiceStats", "StatsStore", "Timer", "sanitize_stat_name"]
