"""The shard half of ``make demo``: build shards from the real photos bundled in scikit-image,
show and check them (``python -m wdsr.tools.demo`` runs this, then streams the shards).

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


def bundled_photos(dest: Path) -> Path:
    """Copy scikit-image's bundled photos to ``dest`` (once) and return it."""
    try:
        import skimage
    except ImportError:
        sys.exit("the demo needs scikit-image's bundled photos: pip install -e '.[demo]'")
    data = Path(skimage.__file__).parent / "data"
    dest.mkdir(parents=True, exist_ok=True)
    for name in PHOTOS:
        if (data / name).is_file() and not (dest / name).exists():
            shutil.copyfile(data / name, dest / name)
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
        print(f"copied {upload_photos(args.photos_to)} photos to {args.photos_to}")
        return 0
    work = Path(args.out)
    src = bundled_photos(work / "photos")
    shards = str(work / "shards")
    workers = str(min(2, os.cpu_count() or 1))
    print(f"== shardmaker build {src} {shards} --scale 2,4 --workers {workers}")
    rc = shardmaker_main(["build", str(src), shards, "--scale", "2,4", "--workers", workers, "--max-samples", "3", "--overwrite"])
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
