"""Static feed parsing and validation: the real feeds load, broken feeds are rejected precisely."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecars.transit.gtfs import FeedError, RawFeed, Report, feed_timezone, read_feed
from sidecars.transit.gtfs.notices import FATAL
from sidecars.transit.source import FeedFiles, SourceError

from ..helpers import BULLRUNNER_ZIP, CAIRNS_ZIP, SMALL_FEED, write_feed

DATA = Path(__file__).resolve().parent / "data"


def load(path: Path | str, **options: float) -> RawFeed:
    return read_feed(FeedFiles.load(str(path), 5), **options)  # type: ignore[arg-type]


def notices(report: Report) -> list[str]:
    """Every example of the report as `code file:line: message`, in the order found."""
    found = [(p, code) for (code, _), items in report.examples.items() for p in items]
    return [f"{code} {p.file}:{p.line}: {p.message}" for p, code in found]


def fatal_of(path: Path) -> list[str]:
    with pytest.raises(FeedError) as info:
        load(path)
    return [
        f"{code} {p.file}:{p.line}: {p.message}"
        for (code, severity), items in info.value.report.examples.items()
        if severity == FATAL
        for p in items
    ]


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
    # Served zero-padded, whatever the feed wrote.
    assert "06:00:00" in raw.time_strings and "6:00:00" not in raw.time_strings
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
    assert fatal_of(write_feed(tmp_path / "f.zip", {"stops.txt": None})) == [
        "missing_required_file stops.txt:None: required file missing"
    ]


def test_missing_both_calendars(tmp_path: Path) -> None:
    found = fatal_of(
        write_feed(tmp_path / "f.zip", {"calendar.txt": None, "calendar_dates.txt": None})
    )
    assert found == [
        "missing_calendar_and_calendar_date_files calendar.txt:None: "
        "neither calendar.txt nor calendar_dates.txt is present"
    ]


def test_missing_required_columns_are_all_reported(tmp_path: Path) -> None:
    stops = "stop_id,stop_name\n100001,A\n"
    routes = "route_id,agency_id,route_type\nR1,A,3\n"
    assert fatal_of(write_feed(tmp_path / "f.zip", {"stops.txt": stops, "routes.txt": routes})) == [
        "missing_required_column stops.txt:1: missing required column(s): stop_lat, stop_lon",
        "missing_required_column routes.txt:1: missing required column(s): route_short_name "
        "or route_long_name",
    ]


def test_unterminated_quote_is_fatal(tmp_path: Path) -> None:
    routes = SMALL_FEED["routes.txt"] + 'R2,A,2,"Broken,3,,\n'
    [found] = fatal_of(write_feed(tmp_path / "f.zip", {"routes.txt": routes}))
    assert found.startswith("csv_parsing_failed routes.txt:") and "bad CSV" in found


def test_bad_rows_are_skipped_and_each_reported(tmp_path: Path) -> None:
    stops = SMALL_FEED["stops.txt"] + "100010,Extra,1,2,0,surplus\n"
    trips = SMALL_FEED["trips.txt"] + (
        "NOPE,WK,TX1,,0,,\nR1,NOSERVICE,TX2,,0,,\nR1,WK,TX3,,0,NOSHAPE,\nR1,WK,TX4,,2,,\n"
    )
    stop_times = SMALL_FEED["stop_times.txt"] + (
        "GHOST,10:00:00,10:00:00,100001,1,,,\n"
        "T2,09:30:00,09:30:00,999999,4,,,\n"
        "T2,9h30,9h30,100001,4,,,\n"
        "T2,09:40:00,09:40:00,100001,five,,,\n"
        "T2,09:50:00,09:50:00,100001,6,4,,\n"
    )
    cal = SMALL_FEED["calendar.txt"] + "BAD,1,1,1,1,1,0,0,2026-01-01,20260102\n"
    dates = SMALL_FEED["calendar_dates.txt"] + "WK,20260401,3\n"
    files = {
        "stops.txt": stops,
        "trips.txt": trips,
        "stop_times.txt": stop_times,
        "calendar.txt": cal,
        "calendar_dates.txt": dates,
    }
    raw = load(write_feed(tmp_path / "f.zip", files), max_skipped_share=1.0)
    assert sorted(notices(raw.report)) == sorted([
        "invalid_row_length stops.txt:6: 6 fields but the header has 5",
        "invalid_date calendar.txt:3: start_date '2026-01-01' is not YYYYMMDD",
        "unexpected_enum_value calendar_dates.txt:6: exception_type '3' is not one of 1, 2",
        "foreign_key_violation trips.txt:7: trip 'TX1': route_id 'NOPE' is not a usable route",
        "foreign_key_violation trips.txt:8: trip 'TX2': service_id 'NOSERVICE' is not a usable "
        "service of calendar.txt or calendar_dates.txt",
        "trip_shape_not_found trips.txt:9: trip 'TX3': shape_id 'NOSHAPE'",
        "unexpected_enum_value trips.txt:10: direction_id '2' is not one of 0, 1",
        "foreign_key_violation stop_times.txt:16: trip_id 'GHOST' is not a usable trip",
        "foreign_key_violation stop_times.txt:17: stop_id '999999' is not a usable stop",
        "invalid_time stop_times.txt:18: '9h30' is not H:MM:SS",
        "invalid_integer stop_times.txt:19: stop_sequence 'five' is not an integer",
        "unexpected_enum_value stop_times.txt:20: pickup_type '4'",
        "unused_trip trips.txt:None: trip 'TX3' has no stop times",
        "missing_recommended_file feed_info.txt:None: feed_info.txt is missing (the feed's "
        "version, validity dates and contact)",
    ])  # fmt: skip
    # Everything else is served: TX3 (only its shape was wrong) is kept.
    assert "TX3" in raw.trip_index and "TX1" not in raw.trip_index
    assert len(raw.st_trip) == 14 and len(raw.stop_ids) == 4
    assert raw.report.skipped == {
        "stops.txt": 1,
        "calendar.txt": 1,
        "calendar_dates.txt": 1,
        "trips.txt": 3,
        "stop_times.txt": 5,
    }


def test_report_keeps_the_first_examples_and_counts_all(tmp_path: Path) -> None:
    stop_times = SMALL_FEED["stop_times.txt"] + "".join(
        f"GHOST{i},10:00:00,10:00:00,100001,1,,,\n" for i in range(80)
    )
    raw = load(write_feed(tmp_path / "f.zip", {"stop_times.txt": stop_times}), max_skipped_share=1)
    assert raw.report.counts == {
        ("foreign_key_violation", "error"): 80,
        ("missing_recommended_file", "warning"): 1,
    }
    assert len(raw.report.examples[("foreign_key_violation", "error")]) == 10
    # Past the share of skipped rows allowed, the same feed is rejected.
    with pytest.raises(FeedError) as info:
        load(write_feed(tmp_path / "g.zip", {"stop_times.txt": stop_times}))
    assert info.value.total == 1
    assert "80 of 94 rows skipped" in str(info.value)


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
