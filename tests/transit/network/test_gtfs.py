"""Static feed parsing and validation: the real feeds load, broken feeds are rejected precisely."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecars.transit.gtfs import FeedError, RawFeed, feed_timezone, read_feed
from sidecars.transit.source import FeedFiles, SourceError

from ..helpers import BULLRUNNER_ZIP, CAIRNS_ZIP, SMALL_FEED, write_feed

DATA = Path(__file__).resolve().parent / "data"


def load(path: Path | str) -> RawFeed:
    return read_feed(FeedFiles.load(str(path), 5))


def problems_of(path: Path) -> list[str]:
    with pytest.raises(FeedError) as info:
        load(path)
    return [f"{p.file}:{p.line}: {p.message}" for p in info.value.problems]


def test_cairns_loads_with_every_row() -> None:
    raw = load(CAIRNS_ZIP)
    assert len(raw.stop_ids) == 416
    assert len(raw.routes) == 22
    assert len(raw.trip_ids) == 1339
    assert len(raw.st_trip) == 37790
    assert len(raw.shapes) == 54
    assert raw.timezone == "Australia/Brisbane"
    late = [t for t in raw.time_strings if int(t.split(":")[0]) >= 24]
    assert max(late) == "29:39:00"
    # 1,405 rows give a time past 24:00; 65 rows have blank (non-timepoint) times, interpolated
    # between their neighbours, 3 of which also land past 24:00.
    assert -1 not in raw.st_time
    assert sum(1 for tid in raw.st_time if int(raw.time_strings[tid][:2]) >= 24) == 1408


def test_google_sample_directory_with_single_digit_hours_loads() -> None:
    raw = load(DATA / "google_sample")
    assert "6:00:00" in raw.time_strings
    assert raw.stop_index["STAGECOACH"] >= 0


def test_bullrunner_zip_loads() -> None:
    raw = load(BULLRUNNER_ZIP)
    assert {r.route_id for r in raw.routes} >= {"A", "B", "C", "D", "E", "F"}


def test_directory_and_zip_of_the_same_feed_parse_the_same(tmp_path: Path) -> None:
    z = load(write_feed(tmp_path / "f.zip", {}))
    d = load(write_feed(tmp_path / "dir", {}, as_zip=False))
    assert z.trip_ids == d.trip_ids
    assert z.st_time == d.st_time


def test_stop_times_out_of_order_are_grouped_by_trip_and_sequence(tmp_path: Path) -> None:
    lines = SMALL_FEED["stop_times.txt"].splitlines()
    shuffled = "\n".join([lines[0], *reversed(lines[1:])]) + "\n"
    raw = load(write_feed(tmp_path / "f.zip", {"stop_times.txt": shuffled}))
    t1 = raw.trip_index["T1"]
    first = raw.trip_first[t1]
    assert list(raw.st_seq[first : first + 3]) == [1, 2, 3]
    assert [raw.stop_ids[s] for s in raw.st_stop[first : first + 3]] == [
        "100001",
        "100002",
        "100003",
    ]


def test_blank_intermediate_times_are_interpolated(tmp_path: Path) -> None:
    stop_times = (
        "trip_id,arrival_time,departure_time,stop_id,stop_sequence\n"
        "T1,08:00:00,08:00:00,100001,1\n"
        "T1,,,100002,2\n"
        "T1,08:20:00,08:20:00,100003,3\n"
    )
    trips = "route_id,service_id,trip_id\nR1,WK,T1\n"
    raw = load(write_feed(tmp_path / "f.zip", {"stop_times.txt": stop_times, "trips.txt": trips}))
    assert [raw.time_strings[t] for t in raw.st_time] == ["08:00:00", "08:10:00", "08:20:00"]


def test_missing_required_file(tmp_path: Path) -> None:
    assert problems_of(write_feed(tmp_path / "f.zip", {"stops.txt": None})) == [
        "stops.txt:None: required file missing"
    ]


def test_missing_both_calendars(tmp_path: Path) -> None:
    found = problems_of(
        write_feed(tmp_path / "f.zip", {"calendar.txt": None, "calendar_dates.txt": None})
    )
    assert found == ["calendar.txt or calendar_dates.txt:None: required file missing"]


def test_missing_required_column(tmp_path: Path) -> None:
    stops = "stop_name,stop_lat,stop_lon\nA,1,2\n"
    assert problems_of(write_feed(tmp_path / "f.zip", {"stops.txt": stops})) == [
        "stops.txt:1: missing required column(s): stop_id"
    ]


def test_row_with_too_many_fields(tmp_path: Path) -> None:
    stops = SMALL_FEED["stops.txt"] + "100010,Extra,1,2,0,surplus\n"
    assert problems_of(write_feed(tmp_path / "f.zip", {"stops.txt": stops})) == [
        "stops.txt:6: 6 fields but the header has 5"
    ]


def test_unterminated_quote_is_bad_csv(tmp_path: Path) -> None:
    routes = SMALL_FEED["routes.txt"] + 'R2,A,2,"Broken,3,,\n'
    found = problems_of(write_feed(tmp_path / "f.zip", {"routes.txt": routes}))
    assert len(found) == 1
    assert found[0].startswith("routes.txt:") and "bad CSV" in found[0]


def test_dangling_references_are_each_reported(tmp_path: Path) -> None:
    trips = (
        SMALL_FEED["trips.txt"] + "NOPE,WK,TX1,,0,,\nR1,NOSERVICE,TX2,,0,,\nR1,WK,TX3,,0,NOSHAPE,\n"
    )
    found = problems_of(write_feed(tmp_path / "f.zip", {"trips.txt": trips}))
    assert found == [
        "trips.txt:7: trip 'TX1': route_id 'NOPE' not in routes.txt",
        "trips.txt:8: trip 'TX2': service_id 'NOSERVICE' not in calendar.txt or calendar_dates.txt",
        "trips.txt:9: trip 'TX3': shape_id 'NOSHAPE' not in shapes.txt",
    ]


def test_stop_times_dangling_trip_and_stop(tmp_path: Path) -> None:
    stop_times = SMALL_FEED["stop_times.txt"] + (
        "GHOST,10:00:00,10:00:00,100001,1,,,\nT2,09:30:00,09:30:00,999999,4,,,\n"
    )
    found = problems_of(write_feed(tmp_path / "f.zip", {"stop_times.txt": stop_times}))
    assert found == [
        "stop_times.txt:16: trip_id 'GHOST' not in trips.txt",
        "stop_times.txt:17: stop_id '999999' not in stops.txt",
    ]


def test_bad_time_and_sequence(tmp_path: Path) -> None:
    stop_times = SMALL_FEED["stop_times.txt"] + (
        "T2,9h30,9h30,100001,4,,,\nT2,09:40:00,09:40:00,100001,five,,,\n"
    )
    found = problems_of(write_feed(tmp_path / "f.zip", {"stop_times.txt": stop_times}))
    assert found == [
        "stop_times.txt:16: bad time '9h30' (want H:MM:SS)",
        "stop_times.txt:17: stop_sequence 'five' is not an integer",
    ]


def test_calendar_problems(tmp_path: Path) -> None:
    cal = SMALL_FEED["calendar.txt"] + "BAD,1,1,1,1,1,0,0,2026-01-01,20260102\n"
    dates = SMALL_FEED["calendar_dates.txt"] + "WK,20260401,3\n"
    found = problems_of(
        write_feed(tmp_path / "f.zip", {"calendar.txt": cal, "calendar_dates.txt": dates})
    )
    assert found == [
        "calendar.txt:3: service 'BAD': not a YYYYMMDD date: '2026-01-01'",
        "calendar_dates.txt:6: exception_type must be 1 or 2, not '3'",
    ]


def test_problem_report_is_capped_but_counted(tmp_path: Path) -> None:
    stop_times = SMALL_FEED["stop_times.txt"] + "".join(
        f"GHOST{i},10:00:00,10:00:00,100001,1,,,\n" for i in range(80)
    )
    with pytest.raises(FeedError) as info:
        load(write_feed(tmp_path / "f.zip", {"stop_times.txt": stop_times}))
    assert len(info.value.problems) == 50
    assert info.value.total == 80
    assert "80 problem(s)" in str(info.value)


def test_corrupt_zip_is_a_source_error(tmp_path: Path) -> None:
    good = write_feed(tmp_path / "f.zip", {}).read_bytes()
    corrupt = tmp_path / "corrupt.zip"
    corrupt.write_bytes(good[: len(good) // 2])
    with pytest.raises(SourceError, match="not a readable zip archive"):
        FeedFiles.load(str(corrupt), 5)


def test_zip_with_corrupt_member_data(tmp_path: Path) -> None:
    data = bytearray(write_feed(tmp_path / "f.zip", {}).read_bytes())
    # Damage the compressed bytes of the first member (the central directory stays intact).
    for i in range(60, 90):
        data[i] ^= 0xFF
    broken = tmp_path / "broken.zip"
    broken.write_bytes(bytes(data))
    with pytest.raises(FeedError) as info:
        load(broken)
    assert info.value.problems


def test_missing_path_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"nope\.zip"):
        FeedFiles.load(str(tmp_path / "nope.zip"), 5)


def test_frequencies_expand_into_one_trip_per_departure() -> None:
    raw = load(DATA / "google_sample")
    stba = [t for t in raw.trip_ids if t.startswith("STBA@")]
    # 6:00:00 to 22:00:00 every 1800 s
    assert len(stba) == 32 and stba[0] == "STBA@06:00:00" and stba[-1] == "STBA@21:30:00"
    template = raw.trip_index["STBA"]
    assert raw.trip_count[template] == 0  # the template itself is not a trip
    last = raw.trip_index["STBA@21:30:00"]
    first = raw.trip_first[last]
    assert [raw.time_strings[t] for t in raw.st_time[first : first + 2]] == [
        "21:30:00",
        "21:50:00",
    ]
    # trips without frequencies are kept as they are
    assert raw.trip_count[raw.trip_index["AB1"]] == 2


def test_bullrunner_frequencies() -> None:
    raw = load(BULLRUNNER_ZIP)
    # trip 1: 07:00:00 to 24:00:00 every 600 s
    assert sum(1 for t in raw.trip_ids if t.startswith("1@")) == 102
    assert "1@23:50:00" in raw.trip_index


def test_feed_timezone(tmp_path: Path) -> None:
    assert str(feed_timezone(str(CAIRNS_ZIP))) == "Australia/Brisbane"
    assert str(feed_timezone(str(write_feed(tmp_path / "dir", {}, as_zip=False)))) == (
        "Europe/Lisbon"
    )
    (tmp_path / "not.zip").write_bytes(b"not a zip")
    with pytest.raises(SourceError, match=r"no readable agency\.txt"):
        feed_timezone(str(tmp_path / "not.zip"))
