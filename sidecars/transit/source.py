"""Where bytes come from: an http(s) URL, a local file (a realtime message, a zip), or a local
directory of GTFS files; and how a source is shown without its credentials.

Operators put API keys in source URLs (`?api_key=`, `https://user:pass@host`) and in request
headers. Those never leave the process: `redact` is the form every body, log line and report
shows, and `scrub` removes the secrets from texts made by libraries (an httpx error repeats
the URL it fetched).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import httpx

REDACTED = "***"
# Shorter values are not scrubbed out of texts: "1" or "pb" would garble every message and
# are not credentials.
MIN_SECRET_LENGTH = 4


# Redirects followed per fetch (httpx's own default is 20).
MAX_REDIRECTS = 5


class SourceError(Exception):
    """The source could not be read (network, missing path, not a zip)."""

    # The notice of the validation report this failure is.
    code = "unreadable_file"


class TooLarge(SourceError):
    """The source is over one of the size bounds (TRANSIT_FEED_MAX_*)."""

    code = "feed_too_large"


@dataclass(frozen=True, slots=True)
class Bounds:
    """How large a static feed may be: its bytes as fetched (a zip), the bytes of its files
    once uncompressed; None: no bound."""

    max_bytes: int | None = None
    max_uncompressed_bytes: int | None = None

    def check(self, origin: str, size: int, uncompressed: bool = False) -> None:
        """TooLarge when `size` is over the bound (`uncompressed`: the files')."""
        bound = self.max_uncompressed_bytes if uncompressed else self.max_bytes
        if bound is not None and size > bound:
            what, name = (
                ("its files hold", "TRANSIT_FEED_MAX_UNCOMPRESSED_BYTES")
                if uncompressed
                else ("it is", "TRANSIT_FEED_MAX_BYTES")
            )
            raise TooLarge(f"{origin}: {what} more than {bound:,} bytes ({name})")


NO_BOUNDS = Bounds()


def is_url(source: str) -> bool:
    """Whether a source setting names an http(s) URL rather than a local path."""
    return source.startswith(("http://", "https://"))


def redact(source: str | None) -> str | None:
    """A source as it may be shown: a local file or directory by its name alone (the
    server's paths are not the public's business), a URL with its userinfo and the value of
    every query parameter replaced by `***` (which parameter holds a key is not known),
    fragment dropped."""
    if source is None:
        return None
    if not is_url(source):
        return Path(source).name or source
    parts = urlsplit(source)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = "&".join(
        f"{name}={REDACTED}" for name, _ in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def secrets_of(source: str, headers: dict[str, str] | None = None) -> list[str]:
    """The credential-like strings of a source: its userinfo (and parts), query values and
    header values, raw and percent-decoded, longest first."""
    found: set[str] = set((headers or {}).values())
    if is_url(source):
        parts = urlsplit(source)
        if "@" in parts.netloc:
            userinfo = parts.netloc.rsplit("@", 1)[0]
            found.update((userinfo, *userinfo.split(":", 1)))
        for raw in parts.query.split("&"):
            found.add(raw.partition("=")[2])
        found.update(value for _, value in parse_qsl(parts.query, keep_blank_values=True))
    found |= {unquote(s) for s in found}
    return sorted((s for s in found if len(s) >= MIN_SECRET_LENGTH), key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """A text with every secret replaced by `***`."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port made explicit."""
    default = {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host, url.port or default


def read_bytes(
    source: str,
    timeout: float,
    headers: dict[str, str] | None = None,
    max_bytes: int | None = None,
) -> bytes:
    """The bytes behind a URL (sent with `headers`) or a local file, at most `max_bytes`
    (TooLarge past it, before reading more). The error never holds a credential: it names
    the redacted source.

    Redirects are followed (a CDN serving the feed), but the credentials configured for a
    source are for its origin only: a redirect to another scheme, host or port is fetched
    without the configured headers and without the URL's userinfo (the URL the server gives
    carries only what the server puts in it)."""
    shown = redact(source) or source
    bounds = Bounds(max_bytes=max_bytes)
    if not is_url(source):
        path = Path(source)
        try:
            if max_bytes is not None:
                bounds.check(shown, path.stat().st_size)
            return path.read_bytes()
        except OSError as exc:
            raise SourceError(f"{shown}: {exc.strerror or exc}") from exc
    secrets = secrets_of(source, headers)
    try:
        url = httpx.URL(source)
        home = _origin(url)
        with httpx.Client(timeout=timeout, follow_redirects=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                own = _origin(url) == home
                request = client.build_request("GET", url, headers=headers if own else None)
                response = client.send(request, stream=True)
                try:
                    if response.is_redirect:
                        url = response.next_request.url if response.next_request else url
                        if _origin(url) != home and url.userinfo:
                            url = url.copy_with(userinfo=b"")
                        continue
                    if response.status_code >= 400:
                        raise SourceError(
                            f"{shown}: HTTP {response.status_code} {response.reason_phrase}"
                        )
                    return _read_capped(response, shown, bounds)
                finally:
                    response.close()
        raise SourceError(f"{shown}: more than {MAX_REDIRECTS} redirects")
    except httpx.HTTPError as exc:
        reason = scrub(str(exc), secrets)
        raise SourceError(f"{shown}: {type(exc).__name__}: {reason}") from None


def _read_capped(response: httpx.Response, shown: str, bounds: Bounds) -> bytes:
    """A response's body, stopping as soon as it passes `bounds.max_bytes`."""
    length = response.headers.get("content-length", "")
    if length.isdigit():
        bounds.check(shown, int(length))
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        bounds.check(shown, size)
        chunks.append(chunk)
    return b"".join(chunks)


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
    def load(
        cls,
        source: str,
        timeout: float,
        headers: dict[str, str] | None = None,
        bounds: Bounds = NO_BOUNDS,
    ) -> FeedFiles:
        """Fetch a feed (URL, zip path or directory) without parsing it; TooLarge when it
        is over `bounds` (told before reading or inflating the excess)."""
        if not is_url(source) and Path(source).is_dir():
            directory = Path(source)
            digest = hashlib.sha256()
            members: dict[str, str] = {}
            paths = sorted(directory.glob("*.txt"))
            size = sum(p.stat().st_size for p in paths)
            bounds.check(redact(source) or source, size, uncompressed=True)
            for path in paths:
                members[path.name] = path.name
                digest.update(path.name.encode())
                with path.open("rb") as fh:
                    while chunk := fh.read(1 << 20):
                        digest.update(chunk)
            return cls(redact(source) or source, digest.hexdigest()[:16], None, directory, members)
        blob = read_bytes(source, timeout, headers, bounds.max_bytes)
        return cls.from_zip(blob, redact(source) or source, bounds)

    @classmethod
    def from_zip(
        cls, blob: bytes, origin: str = "<memory>", bounds: Bounds = NO_BOUNDS
    ) -> FeedFiles:
        """Wrap zip bytes; a corrupt archive is a SourceError, files holding more than
        `bounds.max_uncompressed_bytes` TooLarge (the sizes the archive declares: reading
        a member stops at its declared size and fails its CRC if it holds more)."""
        try:
            with zipfile.ZipFile(io.BytesIO(blob)) as archive:
                infos = [info for info in archive.infolist() if not info.is_dir()]
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise SourceError(f"{origin}: not a readable zip archive ({exc})") from exc
        members: dict[str, str] = {}
        size = 0
        for info in infos:
            # Feeds zipped with their folder put the files one level down.
            base = info.filename.rsplit("/", 1)[-1]
            if base.endswith(".txt") and base not in members:
                members[base] = info.filename
                size += info.file_size
        bounds.check(origin, size, uncompressed=True)
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
