"""The files the TLS settings name (gRPC server, xDS client, Redis, memcached), checked when
they are first used, at start-up, as the reference reads them there: the first that cannot
be read is reported in one line naming its variable, instead of an errno without a path."""

from __future__ import annotations

from collections.abc import Iterable


def unreadable(files: Iterable[tuple[str, str]]) -> str | None:
    """`VARIABLE: cannot read PATH: reason` for the first (variable, path) whose file cannot
    be opened (an empty path is a variable left unset); None when every one can."""
    for name, path in files:
        if not path:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as err:
            return f"{name}: cannot read {path}: {err.strerror}"
    return None
