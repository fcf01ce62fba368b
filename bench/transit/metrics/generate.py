"""Generate a realistic synthetic metrics record set from a GTFS feed.

    python bench/transit/metrics/generate.py OUT_DIR [--gtfs ZIP] [--days 30] [--end YYYY-MM-DD]
        [--validations 200000] [--complaints 500] [--agencies 4] [--format csv|jsonl]
        [--time-format iso|unix] [--bad-rows 0.0] [--seed 1]

Writes `validations.<ext>`, `rides.<ext>` and `complaints.<ext>` in the formats of
sidecars/transit/metrics/README.md. Everything is taken from the feed: lines (route short
names / CM line ids), trips with their scheduled start and stop sequence, stops. Agencies are
the feed's `agency_id`s; a feed with a single agency (Cairns has none) is split into
`--agencies` synthetic operators `41`, `42`, ... by line, like Carris Metropolitana's four areas.

Dates: each generated operational day runs the trips of the feed date with the same weekday
nearest the feed's first service week (the Cairns feed is from 2014, the records are recent),
so weekday/weekend patterns are the feed's own. Validations follow the trips: a valid tap is
made at a stop of a running trip, at the scheduled time of that stop plus up to 2 minutes.
Randomness is seeded, so a run is reproducible.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from array import array
from bisect import bisect
from datetime import date, datetime, timedelta
from itertools import accumulate
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[3]

from sidecars.transit.geometry import haversine_m  # noqa: E402
from sidecars.transit.gtfs import read_feed  # noqa: E402
from sidecars.transit.metrics.records import (  # noqa: E402
    COMPLAINT_COLUMNS,
    RIDE_COLUMNS,
    VALIDATION_COLUMNS,
)
from sidecars.transit.network import Network, natural_key  # noqa: E402
from sidecars.transit.settings import DEFAULT_GTFS  # noqa: E402
from sidecars.transit.source import FeedFiles  # noqa: E402
from sidecars.transit.times import format_time, service_time_unix  # noqa: E402

# Municipalities used for complaints when the feed's stops carry none (the 18 AML ones).
AML_MUNICIPALITIES = [
    "1502",
    "1503",
    "1115",
    "1504",
    "1105",
    "1106",
    "1107",
    "1506",
    "1109",
    "1507",
    "1110",
    "1510",
    "1116",
    "1511",
    "1512",
    "1111",
    "1513",
    "1114",
]
# The columns the ingester reads, in its order (one definition: the records module's).
VALIDATION_HEADER = VALIDATION_COLUMNS
RIDE_HEADER = RIDE_COLUMNS
COMPLAINT_HEADER = COMPLAINT_COLUMNS


class Writer:
    """CSV or JSON Lines rows of one kind."""

    def __init__(self, path: Path, header: tuple[str, ...], fmt: str) -> None:
        self.f = open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115
        self.header = header
        self.fmt = fmt
        self.csv = csv.writer(self.f, lineterminator="\n")
        if fmt == "csv":
            self.csv.writerow(header)
        self.count = 0

    def row(self, values: tuple) -> None:
        if self.fmt == "csv":
            self.csv.writerow(values)
        else:
            self.f.write(json.dumps(dict(zip(self.header, values, strict=True))) + "\n")
        self.count += 1

    def raw(self, line: str) -> None:
        self.f.write(line + "\n")

    def close(self) -> None:
        self.f.close()


def feed_day_for(day: date, feed_days: dict[int, date]) -> date | None:
    """The feed date with the same weekday that supplies the trips of `day`."""
    return feed_days.get(day.weekday())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--gtfs", default=DEFAULT_GTFS)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--end", type=date.fromisoformat, default=None, help="last day")
    parser.add_argument("--validations", type=int, default=200_000)
    parser.add_argument("--complaints", type=int, default=500)
    parser.add_argument("--agencies", type=int, default=4)
    parser.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    parser.add_argument("--time-format", choices=("iso", "unix"), default="iso")
    parser.add_argument("--bad-rows", type=float, default=0.0, help="fraction of bad rows")
    parser.add_argument("--timezone", default=None, help="default: the feed's")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    started = time.monotonic()
    rng = random.Random(args.seed)
    files = FeedFiles.load(args.gtfs, 60)
    net = Network(read_feed(files), files.digest, time.time(), args.timezone)
    raw = net.raw
    tz: ZoneInfo = net.tz
    end = args.end or datetime.now(tz).date()
    days = [end - timedelta(days=i) for i in range(args.days - 1, -1, -1)]

    # Lines -> agencies: the feed's own when it has several, else synthetic operators.
    lines = sorted(set(net.trip_line), key=natural_key)
    feed_agencies = sorted({r.agency_id for r in raw.routes if r.agency_id})
    line_agency: dict[str, str] = {}
    if len(feed_agencies) > 1:
        for ti, line in enumerate(net.trip_line):
            line_agency[line] = raw.routes[raw.trip_route[ti]].agency_id
    else:
        for i, line in enumerate(lines):
            line_agency[line] = str(41 + i * args.agencies // max(1, len(lines)))

    # For each weekday, the first feed date with that weekday that has service.
    all_dates = sorted({d for dates in raw.service_dates for d in dates})
    feed_days: dict[int, date] = {}
    for text in all_dates:
        d = date(int(text[:4]), int(text[4:6]), int(text[6:]))
        if d.weekday() not in feed_days and any(net.active_services(d)):
            feed_days[d.weekday()] = d
        if len(feed_days) == 7:
            break

    # Seconds of each stop_time (untimed stops take the previous timed one).
    secs = array("i", bytes(4 * len(raw.st_time)))
    last = 0
    for k, time_id in enumerate(raw.st_time):
        if time_id >= 0:
            last = raw.time_seconds[time_id]
        secs[k] = last

    # Trip facts: length in km.
    stops = raw.stops
    trip_km: list[float] = []
    for ti in range(len(raw.trip_ids)):
        first, count = raw.trip_first[ti], raw.trip_count[ti]
        km = 0.0
        for k in range(first + 1, first + count):
            a, b = stops[raw.st_stop[k - 1]], stops[raw.st_stop[k]]
            km += haversine_m(a.lat, a.lon, b.lat, b.lon) / 1000.0
        trip_km.append(km * 1.25)  # streets are longer than great circles

    municipalities = sorted({s.municipality_id for s in stops if s.municipality_id}) or list(
        AML_MUNICIPALITIES
    )

    args.out.mkdir(parents=True, exist_ok=True)
    ext = args.format
    vw = Writer(args.out / f"validations.{ext}", VALIDATION_HEADER, ext)
    rw = Writer(args.out / f"rides.{ext}", RIDE_HEADER, ext)
    cw = Writer(args.out / f"complaints.{ext}", COMPLAINT_HEADER, ext)

    # Day weights: weekdays carry more riders than weekends.
    weights = [1.0 if d.weekday() < 5 else (0.6 if d.weekday() == 5 else 0.4) for d in days]
    total_w = sum(weights)
    remaining = args.validations
    iso = args.time_format == "iso"
    bad = args.bad_rows
    for di, day in enumerate(days):
        feed_day = feed_day_for(day, feed_days)
        if feed_day is None:
            continue
        active = net.active_services(feed_day)
        trips = [ti for ti in range(len(raw.trip_ids)) if active[raw.trip_service[ti]]]
        if not trips:
            continue
        ymd = day.strftime("%Y%m%d")
        starts: dict[int, int] = {}
        for ti in sorted(trips, key=lambda t: raw.trip_ids[t]):
            first = raw.trip_first[ti]
            start = secs[first]
            line = net.trip_line[ti]
            starts[ti] = service_time_unix(day, start, tz)
            one = rng.random() < 0.93
            three = rng.random() < (0.95 if one else 0.5)
            km = trip_km[ti]
            delay = "" if rng.random() < 0.03 else str(int(rng.gauss(150, 200)))
            rw.row(
                (
                    ymd,
                    line_agency[line],
                    line,
                    raw.trip_ids[ti],
                    format_time(start),
                    int(one),
                    int(three),
                    round(km, 3),
                    round(km * rng.uniform(0.97, 1.05), 3),
                    delay,
                    int(rng.random() < 0.04),
                )
            )
        n = remaining if di == len(days) - 1 else round(args.validations * weights[di] / total_w)
        n = min(n, remaining)
        remaining -= n
        # Busy lines get more riders: weight trips by their number of stops.
        cum = list(accumulate(raw.trip_count[ti] for ti in trips))
        top = cum[-1]
        for _ in range(n):
            ti = trips[bisect(cum, rng.random() * top)]
            first, count = raw.trip_first[ti], raw.trip_count[ti]
            k = first + rng.randrange(max(1, count - 1))
            t = starts[ti] + (secs[k] - secs[first]) + rng.randrange(120)
            line = net.trip_line[ti]
            agency = line_agency[line]
            if bad and rng.random() < bad:
                vw.raw(f"{t},{agency},{line}" if ext == "csv" else '{"time": ')
                continue
            when = datetime.fromtimestamp(t, tz).isoformat() if iso else t
            vw.row(
                (
                    when,
                    agency,
                    line,
                    raw.stop_ids[raw.st_stop[k]],
                    f"{agency}|{1000 + ti % 400}",
                    int(rng.random() < 0.97),
                )
            )
    categories = ("complaint", "info_request", "other")
    channels = ("email", "phone", "web", "store")
    for i in range(args.complaints):
        day = rng.choice(days)
        on_line = rng.random() < 0.7
        cw.row(
            (
                f"C{args.seed}-{i:07d}",
                day.strftime("%Y%m%d"),
                rng.choices(categories, (0.6, 0.3, 0.1))[0],
                rng.choices(channels, (0.5, 0.3, 0.15, 0.05))[0],
                rng.choice(lines) if on_line else "",
                "" if on_line else rng.choice(municipalities),
            )
        )
    for w in (vw, rw, cw):
        w.close()
    print(
        json.dumps(
            {
                "out": str(args.out),
                "validations": vw.count,
                "rides": rw.count,
                "complaints": cw.count,
                "agencies": sorted(set(line_agency.values()), key=natural_key),
                "lines": len(lines),
                "days": [days[0].isoformat(), days[-1].isoformat()],
                "timezone": str(tz.key),
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
