"""The FILE provider's layout: which files form the config, their names, change detection."""

from __future__ import annotations

import os
from pathlib import Path

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


def test_missing_root_is_an_empty_config(tmp_path: Path) -> None:
    layout = FileLayout(str(tmp_path / "absent"), watch_root=False)
    assert layout.read() == []
    assert layout.signature() == ("missing",)
