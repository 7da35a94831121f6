"""The shard half of ``make demo``: build shards from the real photos bundled in scikit-image,
show and check them (``python -m wdsr.tools.demo`` runs this, then streams the shards).

Two photos are held out (:data:`VAL`): ``OUT/photos/train`` becomes ``OUT/shards``, ``OUT/photos/val``
becomes ``OUT/val``, the set the quick start validates on (``wdsr train --val-data``).
No download at run time: the photos ship inside the scikit-image wheel (the ``demo`` extra).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from shardmaker import storage
from shardmaker.cli import main as shardmaker_main
from shardmaker.errors import ShardmakerError, require_extra

PHOTOS = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "motorcycle_left.png",
    "ihc.png",
    "rocket.jpg",
    "hubble_deep_field.jpg",
    "retina.jpg",
)
VAL = ("chelsea.png", "coffee.png")  # held out of the training shards: the quick start's val set


def _log_error(exc: ShardmakerError) -> int:
    print(f"make demo: {exc}", file=sys.stderr)
    return 2


def bundled_photos(dest: Path, split: bool = False) -> Path:
    """Copy scikit-image's bundled photos to ``dest`` (once) and return it: those of :data:`VAL` under
    ``dest/val``, the others under ``dest/train`` with ``split=True``, else all in ``dest``. Without
    scikit-image: a :class:`MissingExtraError` naming the ``demo`` extra."""
    skimage = require_extra("skimage", "the demo (its photos ship in scikit-image)", package="scikit-image")
    data = Path(str(skimage.__file__)).parent / "data"
    for name in PHOTOS:
        folder = dest / ("val" if name in VAL else "train") if split else dest
        folder.mkdir(parents=True, exist_ok=True)
        if (data / name).is_file() and not (folder / name).exists():
            shutil.copyfile(data / name, folder / name)
    return dest


def upload_photos(url: str) -> int:
    """Copy the bundled photos to a folder URL (e.g. ``s3://bucket/raw/photos``); returns how many."""
    fs, root = storage.open_dir(url)
    fs.makedirs(root, exist_ok=True)  # on S3 this makes the bucket if it is not there
    with tempfile.TemporaryDirectory() as tmp:
        files = sorted(bundled_photos(Path(tmp)).iterdir())
        for f in files:
            storage.write_atomic(fs, storage.join(root, f.name), f.read_bytes())
    return len(files)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="demo-out", help="work folder (default: demo-out)")
    p.add_argument(
        "--photos-to",
        metavar="URL",
        help="only copy the bundled photos to this folder URL and stop (seeds the k8s local-dev bucket)",
    )
    args = p.parse_args(argv)
    if args.photos_to:
        try:
            print(f"copied {upload_photos(args.photos_to)} photos to {args.photos_to}")
        except ShardmakerError as exc:
            return _log_error(exc)
        return 0
    work = Path(args.out)
    try:
        src = bundled_photos(work / "photos", split=True)
    except ShardmakerError as exc:
        return _log_error(exc)
    shards = str(work / "shards")
    workers = str(min(2, os.cpu_count() or 1))
    for folder, out in ((src / "train", shards), (src / "val", str(work / "val"))):
        print(f"== shardmaker build {folder} {out} --scale 2,4 --workers {workers}")
        argv = ["build", str(folder), out, "--scale", "2,4", "--workers", workers, "--max-samples", "3", "--overwrite"]
        rc = shardmaker_main(argv)
        if rc:
            return rc
    print(f"\n== shardmaker info {shards}")
    shardmaker_main(["info", shards])
    print(f"\n== shardmaker verify {shards} --deep")
    rc = shardmaker_main(["-q", "verify", shards, "--deep"])
    if rc:
        return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
