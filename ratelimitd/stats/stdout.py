"""gostats' logging sink (no other sink enabled): one JSON line per statistic on stderr."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable
from typing import TextIO

from .base import PeriodicSink, statsd_tag_suffix
from .store import StatsStore


class LoggingSink(PeriodicSink):
    """gostats' logging sink: one JSON line per flushed statistic on stderr."""

    kind = "stdout"

    def __init__(
        self,
        stats: StatsStore,
        *,
        extra_tags: Iterable[tuple[str, str]] = (),
        flush_interval: float = 10.0,
        stream: TextIO | None = None,
    ) -> None:
        super().__init__(stats, flush_interval)
        self.suffix = statsd_tag_suffix(extra_tags)
        self.stream = stream

    def _line(self, name: str, kind: str, value: float) -> str:
        return json.dumps(
            {
                "level": "debug",
                "ts": round(time.time(), 6),
                "logger": "gostats.loggingsink",
                "msg": f"flushing {kind}",
                "json": {"name": name + self.suffix, "type": kind, "value": f"{value:f}"},
            },
            separators=(",", ":"),
        )

    def counter_line(self, name: str, value: float) -> str:
        return self._line(name, "counter", value)

    def gauge_line(self, name: str, value: float) -> str:
        return self._line(name, "gauge", value)

    def timer_line(self, name: str, ms: float, rate: float) -> str:
        return self._line(name, "timer", ms)

    def emit(self, lines: list[str]) -> None:
        stream = self.stream or sys.stderr
        stream.write("\n".join(lines) + "\n")
        stream.flush()
