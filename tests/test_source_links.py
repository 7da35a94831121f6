"""Source folders of symbolic links (issue 39): a train/val split made of links to real photos builds
like the photos themselves; a dangling link is named (exit 2, or skipped with ``--on-error skip``);
a link to a FIFO is left out with a warning and never waited on."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from shardmaker.format.loading import load
from tests.helpers import photos, save, sm

pytestmark = pytest.mark.timeout(120)


def _split(photo_src: Path, root: Path, names: list[str]) -> Path:
    """A split folder of relative links into ``photo_src`` (how train/val splits are usually made)."""
    root.mkdir(parents=True)
    for n in names:
        os.symlink(os.path.relpath(photo_src / n, root), root / n)
    return root


def test_a_folder_of_links_builds_like_the_photos(photo_src, tmp_path, capsys):
    split = _split(photo_src, tmp_path / "train", ["p00.png", "p05.png"])
    rc, _, err = sm(capsys, "build", split, tmp_path / "ds", "--scale", "2", "--workers", "1")
    assert rc == 0, err
    m = load(str(tmp_path / "ds"))
    assert m.samples == 2 and [k for sh in m.shards for k in sh.keys] == ["p00", "p05"]
    # the same bytes as building from the files themselves (the links are read through)
    real = tmp_path / "real"
    real.mkdir()
    for n in ("p00.png", "p05.png"):
        (real / n).write_bytes((photo_src / n).read_bytes())
    assert sm(capsys, "build", real, tmp_path / "ds2", "--scale", "2", "--workers", "1")[0] == 0
    assert [sh.sha256 for sh in load(str(tmp_path / "ds2")).shards] == [sh.sha256 for sh in m.shards]


def test_dangling_links_and_links_to_fifos(photo_src, tmp_path, capsys, caplog):
    split = _split(photo_src, tmp_path / "val", ["p01.png"])
    os.symlink("gone.png", split / "p02.png")  # the photo was moved away
    rc, _, err = sm(capsys, "build", split, tmp_path / "a", "--scale", "2", "--workers", "1")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "p02.png" in err and "symbolic link to gone.png" in err, err
    assert not (tmp_path / "a" / "manifest.json").exists()
    rc, _, err = sm(capsys, "build", split, tmp_path / "b", "--scale", "2", "--workers", "1", "--on-error", "skip")
    assert rc == 0, err
    assert load(str(tmp_path / "b")).samples == 1
    os.unlink(split / "p02.png")
    os.mkfifo(tmp_path / "pipe.png")
    os.symlink(tmp_path / "pipe.png", split / "p03.png")
    with caplog.at_level(logging.WARNING):
        rc, _, err = sm(capsys, "build", split, tmp_path / "c", "--scale", "2", "--workers", "1")
    assert rc == 0, err  # not waited on: the FIFO has no writer
    assert load(str(tmp_path / "c")).samples == 1
    assert any("p03.png" in r.getMessage() and "FIFO" in r.getMessage() for r in caplog.records)
    os.symlink(photo_src, split / "more")  # a link to a folder: named, not walked
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert sm(capsys, "build", split, tmp_path / "d", "--scale", "2", "--workers", "1")[0] == 0
    assert any("more" in r.getMessage() and "link to a folder" in r.getMessage() for r in caplog.records)


def test_a_clip_folder_of_linked_frames(tmp_path, capsys):
    frames = tmp_path / "frames"
    pic = photos()[0]
    for t in range(3):
        save(frames / f"{t:08d}.png", np.ascontiguousarray(pic[t : t + 32, 2 * t : 2 * t + 48]))
    clip = tmp_path / "hr" / "clip0"
    clip.mkdir(parents=True)
    for t in range(3):
        os.symlink(frames / f"{t:08d}.png", clip / f"{t:08d}.png")
    rc, _, err = sm(capsys, "build", tmp_path / "hr", tmp_path / "ds", "--clips", "--scale", "2", "--workers", "1")
    assert rc == 0, err
    assert load(str(tmp_path / "ds")).samples >= 1
