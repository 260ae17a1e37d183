"""Stage-in marks: a root-only directory of empty files named by job id."""

from __future__ import annotations

from pathlib import Path

from bbstage.daemon import staged


def test_prepare_starts_empty_and_root_only(tmp_path: Path) -> None:
    where = tmp_path / "staged"
    where.mkdir(mode=0o777)
    (where / "41").touch()
    staged.prepare(where)
    assert list(where.iterdir()) == [] and where.stat().st_mode & 0o777 == 0o755


def test_prepare_replaces_a_symlink(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").touch()
    (tmp_path / "staged").symlink_to(elsewhere)
    staged.prepare(tmp_path / "staged")
    assert (tmp_path / "staged").is_dir() and not (tmp_path / "staged").is_symlink()
    assert (elsewhere / "keep").exists()


def test_mark_and_unmark_are_idempotent(tmp_path: Path) -> None:
    staged.prepare(tmp_path)
    staged.mark(tmp_path, "42")
    staged.mark(tmp_path, "42")
    assert (tmp_path / "42").stat().st_size == 0
    staged.unmark(tmp_path, "42")
    staged.unmark(tmp_path, "42")
    assert not (tmp_path / "42").exists()
