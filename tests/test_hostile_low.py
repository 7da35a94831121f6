"""Issue 38, the low items and M1/M2: `--check` stats every shard, video frames under --max-pixels and
with alpha, a sparse huge TIFF, checkpoints whose fields or weights are bad, a full disk named."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.helpers import S3_BUCKET
from tests.s3server import s3fs_for
from wdsr.tools.cli import main

SMALL = ["--model", "espcn", "--patch-size", "48", "-k", "4", "--batch-size", "4", "--shuffle-buffer", "16", "--val-every", "0"]


def check(data: str, out: Path) -> list[str]:
    return ["train", "--data", data, "--out", str(out), *SMALL, "--workers", "1", "--check"]


# ---- --check: every shard there, with the manifest's size ------------------------------------------
def test_check_refuses_missing_and_truncated_shards_local(photo_shards, tmp_path, capsys):
    ds = tmp_path / "ds"
    shutil.copytree(photo_shards, ds)
    shards = sorted(ds.glob("*.tar"))
    assert main(check(str(ds), tmp_path / "ok")) == 0  # all there: OK
    capsys.readouterr()
    shards[1].unlink()
    with shards[2].open("r+b") as f:  # truncated to a tar block: still a file, the wrong size
        f.truncate(512)
    assert main(check(str(ds), tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "2 of 4 shards missing or truncated" in err, err
    assert f"{shards[1].name} is missing" in err and f"{shards[2].name} has 512 bytes" in err, err
    for s in shards:  # none left: every one named (the first SHOWN) or counted
        s.unlink(missing_ok=True)
    assert main(check(str(ds), tmp_path / "run")) == 2
    assert "4 of 4 shards" in capsys.readouterr().err


def test_check_refuses_missing_and_truncated_shards_on_s3(s3, s3_photo_shards, tmp_path, capsys):
    fs = s3fs_for(s3.endpoint)
    src, dst = s3_photo_shards.removeprefix("s3://"), f"{S3_BUCKET}/check-missing"
    fs.copy(src, dst, recursive=True)
    names = sorted(p for p in fs.ls(dst) if p.endswith(".tar"))
    fs.rm(names[0])
    fs.pipe(names[3], fs.cat(names[3])[:1024])
    assert main(check(f"s3://{dst}", tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "2 of 4 shards missing or truncated" in err, err
    assert "is missing" in err and "has 1024 bytes" in err, err
