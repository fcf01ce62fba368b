"""Read-only public transit API (GTFS + GTFS-RT) served by Falcon under gunicorn/uvicorn."""
