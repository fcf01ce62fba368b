"""The reference's DogStatsD sink (USE_DOG_STATSD): `name:value|c|#k:v,...` over UDP.

EXTRA_TAGS become real tags, and the DOG_STATSD_MOGRIFIER_* rules rewrite names into tags.
Datagrams are never waited for: a send that fails is dropped (statsd over UDP is lossy).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..settings import DogStatsdMogrifier
from .base import expand, number
from .statsd import StatsdSink
from .store import StatsStore


@dataclass(frozen=True)
class _Mogrifier:
    regex: re.Pattern[str]
    name: str
    tags: tuple[tuple[str, str], ...]


class DogStatsdSink(StatsdSink):
    """The reference's DogStatsD sink: `name:value|c|#k:v,...` over UDP.

    EXTRA_TAGS become tags (`k:v`, values cleaned as gostats cleans them), then the first
    mogrifier whose PATTERN matches the name rewrites it to NAME and adds TAGS (`$N` is the
    N-th group). Timers are sent in milliseconds. Sent as the statsd sink sends over UDP;
    only the lines differ.
    """

    kind = "dogstatsd"

    def __init__(
        self,
        stats: StatsStore,
        host: str,
        port: int,
        *,
        mogrifiers: Iterable[DogStatsdMogrifier] = (),
        **options: Any,
    ) -> None:
        """`options` as the statsd sink's (`extra_tags`, `flush_interval`); always UDP."""
        super().__init__(stats, host, port, protocol="udp", **options)
        self.tags = [f"{k}:{v}" for k, v in self.extra_tags]
        self.mogrifiers = [_Mogrifier(m.regex, m.metric_name, m.tags) for m in mogrifiers]
        self._names: dict[str, str] = {}

    def mogrify(self, name: str) -> tuple[str, list[str]]:
        """The DogStatsD name and tags of a statistic."""
        for m in self.mogrifiers:
            match = m.regex.search(name)
            if match is None:
                continue
            groups = (match.group(0), *match.groups())
            tags = [f"{k}:{expand(v, groups)}" for k, v in m.tags]
            return expand(m.name, groups), self.tags + tags
        return name, self.tags

    def _head(self, name: str) -> tuple[str, str]:
        # (name, "|#tags" or "") memoised per statistic: names repeat every flush.
        cached = self._names.get(name)
        if cached is None:
            new_name, tags = self.mogrify(name)
            cached = self._names[name] = new_name + "\0" + ("|#" + ",".join(tags) if tags else "")
        head, _, tail = cached.partition("\0")
        return head, tail

    def counter_line(self, name: str, value: float) -> str:
        head, tags = self._head(name)
        return f"{head}:{number(value)}|c{tags}\n"

    def gauge_line(self, name: str, value: float) -> str:
        head, tags = self._head(name)
        return f"{head}:{number(value)}|g{tags}\n"

    def timer_line(self, name: str, ms: float, rate: float) -> str:
        head, tags = self._head(name)
        sampled = f"|@{rate:.6g}" if rate < 1.0 else ""
        return f"{head}:{number(round(ms, 6))}|ms{sampled}{tags}\n"
