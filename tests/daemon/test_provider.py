"""The FILE provider's layout: which files form the config, their names, change detection."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from ratelimitd.config.errors import ConfigReadError
from ratelimitd.config.provider import FileLayout


def make_tree(root: Path) -> None:
    (root / "config" / "nested").mkdir(parents=True)
    (root / "config" / "basic.yaml").write_text("domain: a\n")
    (root / "config" / ".hidden.yaml").write_text("domain: b\n")
    (root / "config" / "nested" / "deep.yml").write_text("domain: c\n")
    (root / "other").mkdir()
    (root / "other" / "ignored.yaml").write_text("domain: d\n")


def test_watch_root_names_files_like_goruntime_and_keeps_only_the_app_directory(
    tmp_path: Path,
) -> None:
    make_tree(tmp_path / "v1")
    layout = FileLayout(root=str(tmp_path / "v1"), appdirectory="config", watch_root=True)
    names = [f.name for f in layout.read()]
    # Relative path with `/` -> `.`, extension kept; no extension filter; dot-files included.
    assert names == ["config..hidden.yaml", "config.basic.yaml", "config.nested.deep.yml"]
    hidden = FileLayout(str(tmp_path / "v1"), watch_root=True, ignore_dotfiles=True)
    assert [f.name for f in hidden.read()] == ["config.basic.yaml", "config.nested.deep.yml"]


def test_subdirectory_is_part_of_the_base(tmp_path: Path) -> None:
    make_tree(tmp_path / "root" / "sub")
    layout = FileLayout(str(tmp_path / "root"), subdirectory="sub", watch_root=True)
    assert "config.basic.yaml" in [f.name for f in layout.read()]
    flat = FileLayout(str(tmp_path / "root"), subdirectory="sub", watch_root=False)
    assert [f.name for f in flat.read()] == [".hidden.yaml", "basic.yaml", "nested.deep.yml"]


def test_watch_root_signature_follows_the_symlink_only(tmp_path: Path) -> None:
    make_tree(tmp_path / "v1")
    make_tree(tmp_path / "v2")
    current = tmp_path / "current"
    current.symlink_to(tmp_path / "v1")
    layout = FileLayout(str(current), watch_root=True)
    before = layout.signature()
    (tmp_path / "v1" / "config" / "basic.yaml").write_text("domain: changed\n")
    assert layout.signature() == before  # writes under the root do not reload in this mode
    tmp = tmp_path / "tmp-link"
    tmp.symlink_to(tmp_path / "v2")
    os.replace(tmp, current)
    assert layout.signature() != before


def test_directory_signature_sees_write_create_chmod_and_remove(tmp_path: Path) -> None:
    make_tree(tmp_path)
    layout = FileLayout(str(tmp_path), watch_root=False)
    path = tmp_path / "config" / "basic.yaml"
    seen = {layout.signature()}

    path.write_text("domain: a2\n")
    seen.add(layout.signature())
    (tmp_path / "config" / "new.yaml").write_text("domain: n\n")
    seen.add(layout.signature())
    path.chmod(0o600)
    seen.add(layout.signature())
    path.unlink()
    seen.add(layout.signature())
    assert len(seen) == 5


def read_error(layout: FileLayout) -> ConfigReadError:
    with pytest.raises(ConfigReadError) as info:
        layout.read()
    return info.value


@pytest.mark.parametrize("watch_root", [True, False])
def test_a_missing_directory_is_a_read_error_not_an_empty_config(
    tmp_path: Path, watch_root: bool
) -> None:
    layout = FileLayout(str(tmp_path / "absent"), watch_root=watch_root)
    err = read_error(layout)
    assert err.errno == errno.ENOENT
    assert err.name == str(tmp_path / "absent" / ("" if watch_root else "config"))
    assert str(err).endswith("No such file or directory [errno 2 ENOENT]")
    # A distinct, stable signature: the poll sees the directory come back.
    assert layout.signature() == layout.signature() != ()


def test_a_base_that_is_a_file_is_a_read_error(tmp_path: Path) -> None:
    (tmp_path / "config").write_text("domain: a\n")
    assert read_error(FileLayout(str(tmp_path), watch_root=False)).errno == errno.ENOTDIR


def _socket_file(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    return sock


@pytest.mark.parametrize("watch_root", [True, False])
@pytest.mark.parametrize(
    ("make", "code"),
    [
        # A symlink to itself: open() fails with ELOOP.
        (lambda p: p.symlink_to(p.name), errno.ELOOP),
        # A symlink whose target is gone.
        (lambda p: p.symlink_to(p.parent / "gone.yaml"), errno.ENOENT),
        # A directory cycle through a symlink (os.walk follows links, as goruntime's keys do).
        (lambda p: p.symlink_to("."), errno.ELOOP),
        # Not a regular file: a unix socket, a FIFO (open() would block), a device.
        (_socket_file, errno.ENXIO),
        (lambda p: os.mkfifo(p), None),
        (lambda p: p.symlink_to("/dev/zero"), None),
    ],
    ids=["symlink-loop", "dangling-symlink", "directory-cycle", "socket", "fifo", "device"],
)
def test_an_unreadable_entry_fails_the_whole_read(
    tmp_path: Path, watch_root: bool, make: Callable[[Path], object], code: int | None
) -> None:
    make_tree(tmp_path)
    bad = tmp_path / "config" / "zz-bad.yaml"
    keep = make(bad)
    layout = FileLayout(str(tmp_path), watch_root=watch_root)
    err = read_error(layout)
    assert err.errno == code
    assert err.name.startswith(str(bad))
    if code is None:
        assert "not a regular file" in str(err)
    else:
        assert f"[errno {code} {errno.errorcode[code]}]" in str(err)
    if isinstance(keep, socket.socket):
        keep.close()
    # In a watched directory the signature still changes when such an entry goes away.
    before = layout.signature()
    bad.unlink()
    assert watch_root or layout.signature() != before
    assert len(layout.read()) == 3
