"""Per-worker totals files: how RATELIMITD_WORKERS > 1 processes serve one Prometheus scrape.

Each worker is given a shared directory and its index; it writes its totals to
`<dir>/worker-<index>.json` (atomically, on every flush and before answering a scrape), and
whichever worker answers a scrape serves the sum of all the files, so the scrape shows the
whole daemon and counters never go backwards. A restarted worker starts from its
predecessor's file, so its counters continue.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from . import process
from .base import CUMULATIVE_GAUGE_SUFFIXES
from .store import CONFIG_GAUGE_SUFFIX, StatsStore


@dataclass
class Totals:
    """One process's statistics in the shape the Prometheus sink sums over workers."""

    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    # name -> (bounds ms, bucket counts, count, sum ms)
    timers: dict[str, tuple[list[float], list[int], int, float]] = field(default_factory=dict)
    # process_* metrics (stats.process): of the living processes only, like gauges.
    process: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, stats: StatsStore, snapshot: dict[str, float] | None = None) -> Totals:
        """The current totals of a store (from `snapshot` when one was just taken)."""
        if snapshot is None:
            snapshot = stats.snapshot()
        # After the snapshot: taking one is what names a budget rule's reserved gauge.
        gauge_names = stats.gauge_names()
        totals = cls()
        for name, value in snapshot.items():
            if name in gauge_names and not name.endswith(CUMULATIVE_GAUGE_SUFFIXES):
                totals.gauges[name] = value
            else:
                totals.counters[name] = value
        for t in stats.timers():
            totals.timers[t.name] = (list(t.bounds), list(t.buckets), t.count, t.sum)
        totals.process = process.read()
        return totals

    def add(self, other: Totals, gauges: bool = True) -> None:
        """Add another process's totals (gauges too unless told otherwise)."""
        for name, value in other.counters.items():
            self.counters[name] = self.counters.get(name, 0) + value
        if gauges:
            for name, value in other.gauges.items():
                if name.endswith(CONFIG_GAUGE_SUFFIX):  # the same config in every worker
                    self.gauges[name] = max(self.gauges.get(name, 0), value)
                else:
                    self.gauges[name] = self.gauges.get(name, 0) + value
            process.combine(self.process, other.process)
        for name, (bounds, buckets, count, total) in other.timers.items():
            mine = self.timers.get(name)
            if mine is None or mine[0] != bounds:
                if mine is not None:
                    continue  # bounds differ (a worker with another mapper): keep ours
                self.timers[name] = (list(bounds), list(buckets), count, total)
                continue
            merged = [a + b for a, b in zip(mine[1], buckets, strict=True)]
            self.timers[name] = (mine[0], merged, mine[2] + count, mine[3] + total)

    def to_json(self) -> bytes:
        """The file format of the worker share."""
        return json.dumps(
            {
                "counters": self.counters,
                "gauges": self.gauges,
                "timers": self.timers,
                "process": self.process,
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Totals:
        """Parse `to_json` output."""
        raw = json.loads(data)
        timers = {
            k: (list(v[0]), list(v[1]), int(v[2]), float(v[3])) for k, v in raw["timers"].items()
        }
        return cls(dict(raw["counters"]), dict(raw["gauges"]), timers, dict(raw.get("process", {})))


class WorkerShare:
    """A directory where each worker process keeps its totals for the Prometheus scrape."""

    def __init__(self, directory: str, index: int) -> None:
        self.directory = directory
        self.index = index
        self.path = os.path.join(directory, f"worker-{index}.json")
        # A restarted worker continues from its predecessor's counters.
        self.base = Totals()
        try:
            with open(self.path, "rb") as f:
                self.base.add(Totals.from_json(f.read()), gauges=False)
        except (OSError, ValueError, KeyError, TypeError):
            pass

    def write(self, totals: Totals) -> None:
        """Replace this worker's file atomically with base + totals."""
        merged = Totals()
        merged.add(self.base, gauges=False)
        merged.add(totals)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(merged.to_json())
        os.replace(tmp, self.path)

    def read_all(self) -> Totals:
        """The sum over every worker's file."""
        total = Totals()
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return total
        for name in names:
            if not (name.startswith("worker-") and name.endswith(".json")):
                continue
            try:
                with open(os.path.join(self.directory, name), "rb") as f:
                    total.add(Totals.from_json(f.read()))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being replaced, or not ours
        return total
