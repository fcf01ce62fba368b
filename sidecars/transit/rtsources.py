"""Reading GTFS-Realtime sources: a FeedMessage's bytes and the vehicle metadata CSV, each
checked whole before the poller lets it replace the last good one (`store.py`); `realtime.py`
joins what they hold to the static network."""

from __future__ import annotations

import csv
import io
from typing import Any

from google.protobuf.message import DecodeError
from google.transit import gtfs_realtime_pb2 as rt


class RealtimeError(ValueError):
    """A GTFS-RT message or metadata file that cannot be used."""


def parse_feed(data: bytes) -> rt.FeedMessage:
    """Decode a GTFS-RT FeedMessage."""
    message = rt.FeedMessage()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise RealtimeError(f"not a GTFS-RT FeedMessage: {exc}") from exc
    if not message.header.gtfs_realtime_version:
        raise RealtimeError("not a GTFS-RT FeedMessage: header.gtfs_realtime_version missing")
    return message


def parse_vehicle_metadata(text: str) -> dict[str, dict[str, Any]]:
    """Vehicle metadata CSV (`id` or `vehicle_id` column, then any Vehicle metadata columns)."""
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")))
    fields = set(reader.fieldnames or ())
    key = "id" if "id" in fields else "vehicle_id" if "vehicle_id" in fields else None
    if key is None:
        raise RealtimeError("vehicle metadata CSV needs an `id` or `vehicle_id` column")
    out: dict[str, dict[str, Any]] = {}
    for line, row in enumerate(reader, 2):
        meta: dict[str, Any] = {}
        try:
            for name in ("make", "model", "owner", "propulsion", "license_plate", "door_status"):
                if row.get(name):
                    meta[name] = row[name].strip()
            if row.get("registration_date"):
                meta["registration_date"] = row["registration_date"].strip().replace("-", "")
            for name in ("capacity_seated", "capacity_standing", "capacity_total"):
                if row.get(name):
                    meta[name] = int(row[name])
            for name in ("bikes_allowed", "wheelchair_accessible"):
                if row.get(name):
                    meta[name] = row[name].strip().lower() in ("1", "true", "yes")
        except ValueError as exc:
            raise RealtimeError(f"vehicle metadata line {line}: {exc}") from exc
        out[row[key].strip()] = meta
    return out
