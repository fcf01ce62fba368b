"""The FILE config provider: which files form the config, their names, and reload.

Names and triggers are those of the reference's goruntime-based provider:

* RUNTIME_WATCH_ROOT=true (default): every file under RUNTIME_ROOT/RUNTIME_SUBDIRECTORY
  becomes a key, its relative path with `/` replaced by `.` and the extension kept
  (`config.basic.yaml`); only keys starting with `RUNTIME_APPDIRECTORY.` are loaded. A
  reload happens when the RUNTIME_ROOT symlink is swapped.
* RUNTIME_WATCH_ROOT=false: every file in RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
  RUNTIME_APPDIRECTORY is loaded, named by its path relative to that directory; any write,
  create, chmod or remove in it reloads.

There is no extension filter; dot-files count unless RUNTIME_IGNOREDOTFILES. Changes are
found by polling a cheap signature of the watched paths (no inotify dependency); a reload
reads and compiles everything off the event loop and hands back one new RuleSet.

Unlike goruntime, which logs a file it cannot read at warning level and loads the others,
any read error (a directory renamed away, a dangling symlink, a symlink loop, no file
descriptors left, something that is not a regular file) fails the whole read with a
`ConfigReadError` naming the path and the errno: an unreadable config is never an empty one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import ConfigReadError
from .loader import ConfigFile, decode_config, read_file

Signature = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class FileLayout:
    """Where configs live and how they are watched (from the RUNTIME_* settings)."""

    root: str
    subdirectory: str = ""
    appdirectory: str = "config"
    watch_root: bool = True
    ignore_dotfiles: bool = False

    @property
    def base(self) -> str:
        """The directory whose files become keys."""
        if self.watch_root:
            return os.path.join(self.root, self.subdirectory)
        return os.path.join(self.root, self.subdirectory, self.appdirectory)

    def signature(self) -> Signature:
        """Changes whenever the reference would reload (and when a read error comes or goes)."""
        if self.watch_root:
            # The symlink itself: a swap changes its target (and its inode/ctime).
            try:
                st = os.lstat(self.root)
            except OSError as exc:
                return ("unreadable", exc.errno)
            return (os.path.realpath(self.root), st.st_ino, st.st_ctime_ns)
        entries: list[tuple[object, ...]] = []
        try:
            with os.scandir(self.base) as it:
                for entry in it:
                    try:
                        st = entry.stat()
                    except OSError as exc:
                        entries.append((entry.name, "unreadable", exc.errno))
                        continue
                    entries.append(
                        (
                            entry.name,
                            st.st_ino,
                            st.st_mtime_ns,
                            st.st_ctime_ns,
                            st.st_size,
                            st.st_mode,
                        )
                    )
        except OSError as exc:
            return ("unreadable", exc.errno)
        return tuple(sorted(entries))

    def read(self) -> list[ConfigFile]:
        """The config files, named as the reference names them, in name order.

        Raises ConfigReadError if the directory or any file in it cannot be read.
        """
        return [decode_config(key, read_file(path)) for path, key in self.files()]

    def files(self) -> list[tuple[str, str]]:
        """(path, key) of every config file, in key order; ConfigReadError on a listing error."""
        base = os.path.normpath(self.base)
        found = []
        for path, key in self._walk(base):
            if not self.watch_root or key.startswith(self.appdirectory + "."):
                found.append((path, key))
        return sorted(found, key=lambda item: item[1])

    def _walk(self, base: str) -> list[tuple[str, str]]:
        out = []
        # os.walk would skip a directory it cannot list (and an unlistable base would look
        # empty); raise instead. Entries it cannot stat come back as files, which then fail
        # to open. A symlinked directory cycle ends in ELOOP after 40 levels.
        for dirpath, dirnames, filenames in os.walk(base, onerror=_raise, followlinks=True):
            if self.ignore_dotfiles:
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel_dir = os.path.relpath(dirpath, base)
            for name in filenames:
                if self.ignore_dotfiles and name.startswith("."):
                    continue
                rel = name if rel_dir == "." else os.path.join(rel_dir, name)
                out.append((os.path.join(dirpath, name), rel.replace(os.sep, ".")))
        return out


def _raise(exc: OSError) -> None:
    raise ConfigReadError.from_os_error(exc)
