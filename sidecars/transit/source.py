"""Where bytes come from: an http(s) URL, a local file (a realtime message, a zip), or a local
directory of GTFS files."""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx


class SourceError(Exception):
    """The source could not be read (network, missing path, not a zip)."""


def is_url(source: str) -> bool:
    """Whether a source setting names an http(s) URL rather than a local path."""
    return source.startswith(("http://", "https://"))


def read_bytes(source: str, timeout: float) -> bytes:
    """The bytes behind a URL or a local file."""
    if is_url(source):
        try:
            response = httpx.get(source, timeout=timeout, follow_redirects=True)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise SourceError(f"{source}: {exc}") from exc
        return response.content
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        raise SourceError(f"{source}: {exc.strerror or exc}") from exc


@dataclass(slots=True)
class FeedFiles:
    """The text files of one static GTFS feed, from a zip held in memory or a directory.

    `digest` identifies the content, so a refresh that finds the same bytes does no work.
    """

    origin: str
    digest: str
    blob: bytes | None
    directory: Path | None
    _members: dict[str, str]

    @classmethod
    def load(cls, source: str, timeout: float) -> FeedFiles:
        """Fetch a feed (URL, zip path or directory) without parsing it."""
        if not is_url(source) and Path(source).is_dir():
            directory = Path(source)
            digest = hashlib.sha256()
            members: dict[str, str] = {}
            for path in sorted(directory.glob("*.txt")):
                members[path.name] = path.name
                digest.update(path.name.encode())
                with path.open("rb") as fh:
                    while chunk := fh.read(1 << 20):
                        digest.update(chunk)
            return cls(source, digest.hexdigest()[:16], None, directory, members)
        blob = read_bytes(source, timeout)
        return cls.from_zip(blob, source)

    @classmethod
    def from_zip(cls, blob: bytes, origin: str = "<memory>") -> FeedFiles:
        """Wrap zip bytes; a corrupt archive is a SourceError."""
        try:
            with zipfile.ZipFile(io.BytesIO(blob)) as archive:
                names = [info.filename for info in archive.infolist() if not info.is_dir()]
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise SourceError(f"{origin}: not a readable zip archive ({exc})") from exc
        members: dict[str, str] = {}
        for name in names:
            # Feeds zipped with their folder put the files one level down.
            base = name.rsplit("/", 1)[-1]
            if base.endswith(".txt") and base not in members:
                members[base] = name
        return cls(origin, hashlib.sha256(blob).hexdigest()[:16], blob, None, members)

    def names(self) -> set[str]:
        """The `.txt` files present."""
        return set(self._members)

    @contextmanager
    def open_text(self, name: str) -> Iterator[IO[str]]:
        """One file as text; BOMs are dropped and newlines left to the csv module."""
        member = self._members[name]
        if self.directory is not None:
            with (self.directory / member).open(encoding="utf-8-sig", newline="") as fh:
                yield fh
            return
        assert self.blob is not None
        with zipfile.ZipFile(io.BytesIO(self.blob)) as archive, archive.open(member) as raw:
            yield io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")

    def zip_bytes(self) -> bytes:
        """The feed as a zip (a directory source is zipped on first use)."""
        if self.blob is not None:
            return self.blob
        assert self.directory is not None
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, member in sorted(self._members.items()):
                archive.write(self.directory / member, name)
        self.blob = out.getvalue()
        return self.blob
