"""stop_times.txt as parallel `array` columns: the hot loop, grouping by trip, blank times,
and the expansion of frequency-based trips.

A Carris-Metropolitana-sized feed has about four million stop_times, so they are kept as
parallel columns of small integers (trip, stop, sequence, interned time, flags) instead of one
object per row: the whole table costs tens of megabytes.
"""

from __future__ import annotations

from array import array

from ..times import BadTime, format_time, parse_time
from .tables import NO_DROP_OFF, NO_PICKUP, Problems, Table, Trips


class StopTimes:
    """The stop_times columns of one feed, grouped by trip and ordered by stop_sequence."""

    def __init__(self, trips: Trips, stop_index: dict[str, int], problems: Problems) -> None:
        self.trips = trips
        self.stop_index = stop_index
        self.problems = problems

    def read(self, t: Table) -> None:
        """Read stop_times.txt: the hot loop (four million rows on a large feed)."""
        i_trip, i_stop = t.index("trip_id"), t.index("stop_id")
        i_seq, i_arr, i_dep = (
            t.index("stop_sequence"),
            t.index("arrival_time"),
            t.index("departure_time"),
        )
        i_pu, i_do, i_dist = (
            t.index("pickup_type"),
            t.index("drop_off_type"),
            t.index("shape_dist_traveled"),
        )
        ntrips = len(self.trips.trip_ids)
        st_trip, st_stop, st_seq = array("i"), array("i"), array("i")
        st_time, st_flags = array("i"), array("B")
        st_dist = array("f") if i_dist >= 0 else None
        trip_first = array("i", [-1]) * ntrips
        trip_count = array("i", [0]) * ntrips
        time_ids: dict[str, int] = {"": -1}
        self._time_ids = time_ids
        self.time_strings: list[str] = []
        self.time_seconds = array("i")
        add_trip, add_stop, add_seq = st_trip.append, st_stop.append, st_seq.append
        add_time, add_flags = st_time.append, st_flags.append
        add_dist = st_dist.append if st_dist is not None else None
        trip_get, stop_get, time_get = self.trips.trip_index.get, self.stop_index.get, time_ids.get
        problem = self.problems.add
        name = t.name
        grouped = True
        last_trip: str | None = None
        ti = -1
        last_seq = -1
        n = 0
        for row in t.rows():
            trip_id = row[i_trip]
            if trip_id != last_trip:
                last_trip = trip_id
                ti = trip_get(trip_id.strip(), -1)
                if ti < 0:
                    problem(name, t.line, f"trip_id {trip_id!r} not in trips.txt")
                    continue
                if trip_first[ti] >= 0:
                    grouped = False
                else:
                    trip_first[ti] = n
                last_seq = -1
            elif ti < 0:
                problem(name, t.line, f"trip_id {trip_id!r} not in trips.txt")
                continue
            stop = stop_get(row[i_stop])
            if stop is None:
                stop = stop_get(row[i_stop].strip())
                if stop is None:
                    problem(name, t.line, f"stop_id {row[i_stop]!r} not in stops.txt")
                    continue
            try:
                seq = int(row[i_seq])
            except ValueError:
                problem(name, t.line, f"stop_sequence {row[i_seq]!r} is not an integer")
                continue
            if seq <= last_seq:
                grouped = False
            last_seq = seq
            text = row[i_arr]
            tid = time_get(text)
            if tid is None or tid < 0:
                if tid is None:
                    tid = self._intern_time(text, time_ids, t)
                if tid == -1 and i_dep >= 0:
                    text = row[i_dep]
                    tid = time_get(text)
                    if tid is None:
                        tid = self._intern_time(text, time_ids, t)
                if tid == -2:
                    continue
            flags = 0
            if i_pu >= 0 and row[i_pu] == "1":
                flags = NO_PICKUP
            if i_do >= 0 and row[i_do] == "1":
                flags |= NO_DROP_OFF
            if add_dist is not None:
                dist = row[i_dist]
                try:
                    add_dist(float(dist) if dist else 0.0)
                except ValueError:
                    problem(name, t.line, f"shape_dist_traveled {dist!r} is not a number")
                    add_dist(0.0)
            add_trip(ti)
            add_stop(stop)
            add_seq(seq)
            add_time(tid)
            add_flags(flags)
            trip_count[ti] += 1
            n += 1
        self.st_trip, self.st_stop, self.st_seq = st_trip, st_stop, st_seq
        self.st_time, self.st_flags, self.st_dist = st_time, st_flags, st_dist
        self.trip_first, self.trip_count = trip_first, trip_count
        self._grouped = grouped

    def _intern_time(self, text: str, time_ids: dict[str, int], t: Table) -> int:
        """Id of a time string; -1 for blank, -2 (after reporting) for a malformed one."""
        clean = text.strip()
        if not clean:
            time_ids[text] = -1
            return -1
        try:
            seconds = parse_time(clean)
        except BadTime:
            self.problems.add(t.name, t.line, f"bad time {text!r} (want H:MM:SS)")
            return -2
        tid = time_ids.get(clean)
        if tid is None:
            tid = len(self.time_strings)
            self.time_strings.append(clean)
            self.time_seconds.append(seconds)
            time_ids[clean] = tid
        time_ids[text] = tid
        return tid

    def group(self) -> None:
        """Make each trip's rows contiguous and ordered by stop_sequence, and fill blank times."""
        n = len(self.st_trip)
        if not self._grouped:
            # Rare (most producers write stop_times sorted): a full reorder.
            st_trip, st_seq = self.st_trip, self.st_seq
            order = sorted(range(n), key=lambda i: (st_trip[i], st_seq[i]))
            for attr in ("st_trip", "st_stop", "st_seq", "st_time", "st_flags", "st_dist"):
                column = getattr(self, attr)
                if column is not None:
                    setattr(self, attr, array(column.typecode, [column[i] for i in order]))
            del order
            trip_first = self.trip_first
            for i in range(len(trip_first)):
                trip_first[i] = -1
            last = -1
            for pos, ti in enumerate(self.st_trip):
                if ti != last:
                    trip_first[ti] = pos
                    last = ti
            seqs = self.st_seq
            for ti, first in enumerate(trip_first):
                if first < 0:
                    continue
                end = first + self.trip_count[ti]
                for pos in range(first + 1, end):
                    if seqs[pos] == seqs[pos - 1]:
                        self.problems.add(
                            "stop_times.txt",
                            None,
                            f"trip {self.trips.trip_ids[ti]!r}: stop_sequence {seqs[pos]} repeated",
                        )
                        break
        if self.st_time.count(-1):
            self._fill_blank_times()

    def expand_frequencies(self, t: Table) -> None:
        """Expand frequency-based trips into one trip per departure.

        A trip listed in frequencies.txt is a template: its stop_times give times relative to
        its first stop. Each departure `start_time, start_time + headway, ... < end_time`
        becomes a trip `<trip_id>@<HH:MM:SS>` (TripUpdates naming the template and that
        start_time are matched to it); the template itself is dropped.
        """
        i_trip, i_start = t.index("trip_id"), t.index("start_time")
        i_end, i_headway = t.index("end_time"), t.index("headway_secs")
        missing = [
            name for name, i in (("trip_id", i_trip), ("start_time", i_start),
                                 ("end_time", i_end), ("headway_secs", i_headway)) if i < 0
        ]  # fmt: skip
        if missing:
            self.problems.add(t.name, 1, f"missing required column(s): {', '.join(missing)}")
            return
        runs: dict[int, list[tuple[int, int, int]]] = {}
        for row in t.rows():
            trip_id = row[i_trip].strip()
            ti = self.trips.trip_index.get(trip_id)
            if ti is None:
                self.problems.add(t.name, t.line, f"trip_id {trip_id!r} not in trips.txt")
                continue
            try:
                start, end = parse_time(row[i_start]), parse_time(row[i_end])
                headway = int(row[i_headway])
            except (BadTime, ValueError):
                self.problems.add(t.name, t.line, "bad start_time, end_time or headway_secs")
                continue
            if headway <= 0 or end < start:
                self.problems.add(t.name, t.line, "headway_secs must be > 0 and end >= start")
                continue
            if self.trip_count[ti] == 0:
                continue
            runs.setdefault(ti, []).append((start, end, headway))
        if not runs or self.problems.total:
            return
        old = {
            name: getattr(self, name)
            for name in ("st_trip", "st_stop", "st_seq", "st_time", "st_flags", "st_dist")
        }
        new = {name: array(col.typecode) for name, col in old.items() if col is not None}
        old_first, old_count = self.trip_first, self.trip_count
        first, count = array("i", old_first), array("i", old_count)
        seconds = self.time_seconds

        def copy(src: int, dst: int, shift: int) -> None:
            a, n = old_first[src], old_count[src]
            first[dst], count[dst] = len(new["st_trip"]), n
            new["st_trip"].extend(array("i", [dst]) * n)
            for name in ("st_stop", "st_seq", "st_flags", "st_dist"):
                if name in new:
                    new[name].extend(old[name][a : a + n])
            times = old["st_time"][a : a + n]
            if shift:
                times = array("i", (self._shifted_time(tid, shift) for tid in times))
            new["st_time"].extend(times)

        for ti in range(len(old_first)):
            if ti not in runs:
                if old_count[ti]:
                    copy(ti, ti, 0)
                continue
            base = seconds[old["st_time"][old_first[ti]]]
            for start, end, headway in runs[ti]:
                departure = start
                while departure < end:
                    clone = self.trips.clone(
                        ti, f"{self.trips.trip_ids[ti]}@{format_time(departure)}"
                    )
                    first.append(-1)
                    count.append(0)
                    copy(ti, clone, departure - base)
                    departure += headway
            first[ti], count[ti] = -1, 0
        for name, col in new.items():
            setattr(self, name, col)
        self.trip_first, self.trip_count = first, count

    def _shifted_time(self, tid: int, shift: int) -> int:
        text = format_time(self.time_seconds[tid] + shift)
        shifted = self._time_ids.get(text)
        if shifted is None:
            shifted = self._time_ids[text] = len(self.time_strings)
            self.time_strings.append(text)
            self.time_seconds.append(self.time_seconds[tid] + shift)
        return shifted

    def _fill_blank_times(self) -> None:
        """Interpolate blank (non-timepoint) times linearly between the timed stops around them."""
        times, seconds = self.st_time, self.time_seconds
        ids = {s: i for i, s in enumerate(self.time_strings)}
        for ti, first in enumerate(self.trip_first):
            count = self.trip_count[ti]
            if first < 0 or count == 0:
                continue
            end = first + count
            if -1 not in times[first:end]:
                continue
            if times[first] < 0 or times[end - 1] < 0:
                self.problems.add(
                    "stop_times.txt",
                    None,
                    f"trip {self.trips.trip_ids[ti]!r}: "
                    "first and last stop need arrival/departure times",
                )
                continue
            prev = first
            for pos in range(first + 1, end):
                if times[pos] < 0:
                    continue
                gap = pos - prev
                if gap > 1:
                    a, b = seconds[times[prev]], seconds[times[pos]]
                    for k in range(1, gap):
                        text = format_time(a + (b - a) * k // gap)
                        tid = ids.get(text)
                        if tid is None:
                            tid = ids[text] = len(self.time_strings)
                            self.time_strings.append(text)
                            seconds.append(parse_time(text))
                        times[prev + k] = tid
                prev = pos
