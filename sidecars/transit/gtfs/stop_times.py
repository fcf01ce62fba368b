"""stop_times.txt as parallel `array` columns: the hot loop, grouping by trip, the checks that
need a whole trip, blank times, and the expansion of frequency-based trips.

A Carris-Metropolitana-sized feed has about four million stop_times, so they are kept as
parallel columns of small integers (trip, stop, sequence, interned time, flags) instead of one
object per row: the whole table costs tens of megabytes. The line number of each row is kept
while the feed is read, so a notice found once a trip is complete still says file:line.
"""

from __future__ import annotations

import bisect
from array import array

from ..times import BadTime, format_time, parse_time
from .notices import Cause, Report
from .tables import NO_DROP_OFF, NO_PICKUP, RowError, Table, Trips, integer

NAME = "stop_times.txt"
PICKUP_DROP_OFF = frozenset(("", "0", "1", "2", "3"))
COLUMNS = ("st_trip", "st_stop", "st_seq", "st_time", "st_flags", "st_dist", "st_line")
NAN = float("nan")


class StopTimes:
    """The stop_times columns of one feed, grouped by trip and ordered by stop_sequence."""

    def __init__(
        self,
        trips: Trips,
        stop_index: dict[str, int],
        report: Report,
        dropped_trips: dict[str, Cause] | None = None,
        dropped_stops: dict[str, Cause] | None = None,
    ) -> None:
        """`dropped_*`: trips and stops skipped for a problem of their own; their stop times
        are counted under that notice."""
        self.trips = trips
        self.stop_index = stop_index
        self.report = report
        self._dropped = {"trip_id": dropped_trips or {}, "stop_id": dropped_stops or {}}
        self._templates: set[int] = set()

    def read(self, t: Table) -> None:
        """Read stop_times.txt: the hot loop (four million rows on a large feed).

        A bad row is skipped here; a trip whose times go backwards is remembered and repaired
        in `group()` (dropping the fewest rows).
        """
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
        st_time, st_flags, st_line = array("i"), array("B"), array("i")
        st_dist = array("f") if i_dist >= 0 else None
        trip_first = array("i", [-1]) * ntrips
        trip_count = array("i", [0]) * ntrips
        time_ids: dict[str, int] = {"": -1}
        self._time_ids = time_ids
        self.time_strings: list[str] = []
        self.time_seconds = array("i")
        seconds = self.time_seconds
        add_trip, add_stop, add_seq = st_trip.append, st_stop.append, st_seq.append
        add_time, add_flags, add_line = st_time.append, st_flags.append, st_line.append
        add_dist = st_dist.append if st_dist is not None else None
        trip_get, stop_get, time_get = self.trips.trip_index.get, self.stop_index.get, time_ids.get
        skip = self.report.skip
        flags_ok = PICKUP_DROP_OFF
        backwards: set[int] = set()
        grouped = True
        last_trip: str | None = None
        ti = -1
        last_seq = -1
        last_sec = -1
        n = 0
        for row in t.rows():
            line = t.line
            trip_id = row[i_trip]
            if trip_id != last_trip:
                last_trip = trip_id
                ti = trip_get(trip_id.strip(), -1)
                if ti < 0:
                    self._dangling("trip_id", trip_id, line)
                    continue
                if trip_first[ti] >= 0:
                    grouped = False
                else:
                    trip_first[ti] = n
                last_seq = last_sec = -1
            elif ti < 0:
                self._dangling("trip_id", trip_id, line)
                continue
            stop = stop_get(row[i_stop])
            if stop is None:
                stop = stop_get(row[i_stop].strip())
                if stop is None:
                    self._dangling("stop_id", row[i_stop], line)
                    continue
            text = row[i_seq]
            if text.isdigit() and text.isascii():
                seq = int(text)
            else:
                try:
                    seq = integer(text.strip(), "stop_sequence")
                except RowError as exc:
                    skip(exc.code, NAME, line, str(exc))
                    continue
            text = row[i_arr]
            tid = time_get(text)
            if tid is None or tid < 0:
                if tid is None:
                    tid = self._intern_time(text, line)
                if tid == -1:
                    text = row[i_dep]
                    tid = time_get(text)
                    if tid is None:
                        tid = self._intern_time(text, line)
                if tid == -2:
                    continue
            flags = 0
            if i_pu >= 0:
                value = row[i_pu]
                if value == "1":
                    flags = NO_PICKUP
                elif value not in flags_ok:
                    skip("unexpected_enum_value", NAME, line, f"pickup_type {value!r}")
                    continue
            if i_do >= 0:
                value = row[i_do]
                if value == "1":
                    flags |= NO_DROP_OFF
                elif value not in flags_ok:
                    skip("unexpected_enum_value", NAME, line, f"drop_off_type {value!r}")
                    continue
            if add_dist is not None:
                dist = row[i_dist]
                if dist:
                    try:
                        value_f = float(dist)
                    except ValueError:
                        skip("invalid_float", NAME, line, f"shape_dist_traveled {dist!r}")
                        continue
                    if not value_f >= 0:
                        skip("number_out_of_range", NAME, line, f"shape_dist_traveled {dist}")
                        continue
                    add_dist(value_f)
                else:
                    add_dist(NAN)
            if seq <= last_seq:
                grouped = False
            last_seq = seq
            if tid >= 0:
                sec = seconds[tid]
                if sec < last_sec:
                    backwards.add(ti)
                last_sec = sec
            add_trip(ti)
            add_stop(stop)
            add_seq(seq)
            add_time(tid)
            add_flags(flags)
            add_line(line)
            trip_count[ti] += 1
            n += 1
        self.st_trip, self.st_stop, self.st_seq = st_trip, st_stop, st_seq
        self.st_time, self.st_flags, self.st_dist = st_time, st_flags, st_dist
        self.st_line: array | None = st_line
        self.trip_first, self.trip_count = trip_first, trip_count
        self._grouped = grouped
        self._backwards = backwards

    def _dangling(self, field: str, value: str, line: int) -> None:
        """Skip a row whose trip_id or stop_id is empty or names no usable row."""
        cause = self._dropped[field].get(value.strip())
        if cause is not None:
            self.report.dependant(cause, NAME)
        elif value.strip():
            kind = field.removesuffix("_id")
            message = f"{field} {value!r} is not a usable {kind}"
            self.report.skip("foreign_key_violation", NAME, line, message)
        else:
            self.report.skip("missing_required_field", NAME, line, f"{field} is empty")

    def _intern_time(self, text: str, line: int) -> int:
        """Id of a time; -1 for blank, -2 (after skipping the row) for a malformed one.

        Times are kept zero-padded (`06:00:00`) whatever the feed wrote (`6:00:00`).
        """
        clean = text.strip()
        if not clean:
            self._time_ids[text] = -1
            return -1
        try:
            seconds = parse_time(clean)
        except BadTime:
            self.report.skip("invalid_time", NAME, line, f"{text!r} is not H:MM:SS")
            return -2
        tid = self._time_id(seconds)
        self._time_ids[text] = tid
        return tid

    def _time_id(self, seconds: int) -> int:
        """Id of the zero-padded time string of `seconds`."""
        text = format_time(seconds)
        tid = self._time_ids.get(text)
        if tid is None:
            tid = self._time_ids[text] = len(self.time_strings)
            self.time_strings.append(text)
            self.time_seconds.append(seconds)
        return tid

    # -- whole trips ------------------------------------------------------------------------

    def group(self) -> None:
        """Make each trip's rows contiguous and ordered by stop_sequence, skip the rows that
        repeat a sequence or go back in time, and fill blank times."""
        drop: set[int] = set()
        if not self._grouped:
            self._reorder()
            drop |= self._repeated_sequences()
            # Times were compared in file order; compare them again in sequence order.
            self._backwards = self._find_backwards()
        for ti in sorted(self._backwards):
            drop |= self._backwards_rows(ti)
        if drop:
            self._compact(drop)
        drop = self._fill_blank_times()
        if drop:
            self._compact(drop)
        self._check_distances()
        self.st_line = None

    def _reorder(self) -> None:
        """Rare (most producers write stop_times sorted): a full reorder by (trip, sequence),
        stable so a repeated sequence keeps the file's order."""
        st_trip, st_seq = self.st_trip, self.st_seq
        order = sorted(range(len(st_trip)), key=lambda i: (st_trip[i], st_seq[i]))
        for attr in COLUMNS:
            column = getattr(self, attr)
            if column is not None:
                setattr(self, attr, array(column.typecode, [column[i] for i in order]))
        del order
        self._index_trips()

    def _index_trips(self) -> None:
        trip_first, trip_count = self.trip_first, self.trip_count
        for i in range(len(trip_first)):
            trip_first[i] = -1
            trip_count[i] = 0
        last = -1
        for pos, ti in enumerate(self.st_trip):
            if ti != last:
                trip_first[ti] = pos
                last = ti
            trip_count[ti] += 1

    def _rows(self, ti: int) -> range:
        first = self.trip_first[ti]
        return range(first, first + self.trip_count[ti]) if first >= 0 else range(0)

    def _line(self, pos: int) -> int | None:
        return self.st_line[pos] if self.st_line is not None else None

    def _repeated_sequences(self) -> set[int]:
        drop: set[int] = set()
        seqs = self.st_seq
        for ti in range(len(self.trip_first)):
            rows = self._rows(ti)
            for pos in rows[1:]:
                if seqs[pos] == seqs[pos - 1]:
                    drop.add(pos)
                    self.report.skip(
                        "duplicate_key",
                        NAME,
                        self._line(pos),
                        f"trip {self.trips.trip_ids[ti]!r}: stop_sequence {seqs[pos]} repeated",
                    )
        return drop

    def _find_backwards(self) -> set[int]:
        """Trips whose timed rows go back in time somewhere."""
        found: set[int] = set()
        st_trip, times, seconds = self.st_trip, self.st_time, self.time_seconds
        last_trip, last_sec = -1, -1
        for pos, ti in enumerate(st_trip):
            if ti != last_trip:
                last_trip, last_sec = ti, -1
            tid = times[pos]
            if tid >= 0:
                sec = seconds[tid]
                if sec < last_sec:
                    found.add(ti)
                last_sec = sec
        return found

    def _backwards_rows(self, ti: int) -> set[int]:
        """Rows to drop so the trip's times never go back: all but a longest non-decreasing
        run of its timed rows (one mistyped time costs one row, not the rest of the trip)."""
        times, seconds = self.st_time, self.time_seconds
        timed = [p for p in self._rows(ti) if times[p] >= 0]
        values = [seconds[times[p]] for p in timed]
        # Longest non-decreasing subsequence (patience sorting, keeping predecessors).
        tails: list[int] = []
        tail_index: list[int] = []
        parent = [-1] * len(values)
        for i, v in enumerate(values):
            k = bisect.bisect_right(tails, v)
            if k == len(tails):
                tails.append(v)
                tail_index.append(i)
            else:
                tails[k], tail_index[k] = v, i
            parent[i] = tail_index[k - 1] if k else -1
        keep: set[int] = set()
        i = tail_index[-1] if tail_index else -1
        while i >= 0:
            keep.add(i)
            i = parent[i]
        drop = {timed[i] for i in range(len(timed)) if i not in keep}
        trip_id = self.trips.trip_ids[ti]
        for pos in sorted(drop):
            self.report.skip(
                "stop_time_with_arrival_before_previous_departure_time",
                NAME,
                self._line(pos),
                f"trip {trip_id!r}: {self.time_strings[times[pos]]} at stop_sequence "
                f"{self.st_seq[pos]} is out of order with the trip's other times",
            )
        return drop

    def _compact(self, drop: set[int]) -> None:
        """Remove rows by position and re-index the trips."""
        keep = [i for i in range(len(self.st_trip)) if i not in drop]
        for attr in COLUMNS:
            column = getattr(self, attr)
            if column is not None:
                setattr(self, attr, array(column.typecode, [column[i] for i in keep]))
        self._index_trips()

    def _fill_blank_times(self) -> set[int]:
        """Interpolate blank (non-timepoint) times linearly between the timed stops around
        them; a trip whose first or last stop has no time is skipped. Returns rows to drop."""
        drop: set[int] = set()
        times, seconds = self.st_time, self.time_seconds
        if not times.count(-1):
            return drop
        for ti in range(len(self.trip_first)):
            rows = self._rows(ti)
            if not rows or -1 not in times[rows.start : rows.stop]:
                continue
            first, end = rows.start, rows.stop
            if times[first] < 0 or times[end - 1] < 0:
                self.report.skip(
                    "missing_trip_edge",
                    NAME,
                    self._line(first if times[first] < 0 else end - 1),
                    f"trip {self.trips.trip_ids[ti]!r}: the first and last stop need "
                    "arrival_time or departure_time",
                    rows=len(rows),
                )
                drop.update(rows)
                continue
            prev = first
            for pos in range(first + 1, end):
                if times[pos] < 0:
                    continue
                gap = pos - prev
                if gap > 1:
                    a, b = seconds[times[prev]], seconds[times[pos]]
                    for k in range(1, gap):
                        times[prev + k] = self._time_id(a + (b - a) * k // gap)
                prev = pos
        return drop

    def _check_distances(self) -> None:
        """A trip whose shape_dist_traveled goes down gets no feed distances (NaN): its
        stops are then placed on the shape."""
        dist = self.st_dist
        if dist is None:
            return
        for ti in range(len(self.trip_first)):
            rows = self._rows(ti)
            last = -1.0
            for pos in rows:
                d = dist[pos]
                if d != d:  # NaN: blank in the feed
                    continue
                if d < last:
                    self.report.add(
                        "decreasing_or_equal_stop_time_distance",
                        NAME,
                        self._line(pos),
                        f"trip {self.trips.trip_ids[ti]!r}: shape_dist_traveled {d:g} after "
                        f"{last:g}",
                    )
                    for p in rows:
                        dist[p] = NAN
                    break
                last = d

    def check_unused(self) -> None:
        """Trips without stop times are not served (frequency templates are expanded)."""
        for ti, count in enumerate(self.trip_count):
            if count == 0 and ti not in self._templates:
                self.report.add(
                    "unused_trip",
                    "trips.txt",
                    None,
                    f"trip {self.trips.trip_ids[ti]!r} has no stop times",
                )

    # -- frequencies ------------------------------------------------------------------------

    def expand_frequencies(self, t: Table) -> None:
        """Expand frequency-based trips into one trip per departure.

        A trip listed in frequencies.txt is a template: its stop_times give times relative to
        its first stop. Each departure `start_time, start_time + headway, ... < end_time`
        becomes a trip `<trip_id>@<HH:MM:SS>` (TripUpdates naming the template and that
        start_time are matched to it); the template itself is dropped.
        """
        i_trip, i_start = t.index("trip_id"), t.index("start_time")
        i_end, i_headway = t.index("end_time"), t.index("headway_secs")
        runs: dict[int, list[tuple[int, int, int]]] = {}
        for row in t.rows():
            trip_id = row[i_trip].strip()
            ti = self.trips.trip_index.get(trip_id)
            try:
                if ti is None:
                    raise RowError(
                        "foreign_key_violation", f"trip_id {trip_id!r} is not a usable trip"
                    )
                try:
                    start, end = parse_time(row[i_start]), parse_time(row[i_end])
                except BadTime:
                    raise RowError(
                        "invalid_time", "start_time or end_time is not H:MM:SS"
                    ) from None
                headway = integer(row[i_headway].strip(), "headway_secs", 1)
                if end < start:
                    raise RowError("start_and_end_range_out_of_order", "end_time before start_time")
            except RowError as exc:
                t.skip(exc)
                continue
            if self.trip_count[ti] == 0:
                continue
            runs.setdefault(ti, []).append((start, end, headway))
        if not runs:
            return
        self._templates = set(runs)
        old = {name: getattr(self, name) for name in COLUMNS if name != "st_line"}
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
                times = array("i", (self._time_id(seconds[tid] + shift) for tid in times))
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
