"""wdsr against the recipes SR users run today, side by side in one run (``pip install -e '.[bench]'``).

    .venv/bin/python -m bench.peers [--seconds 15] [--frames 128] [--out bench/out]

The 128 4K frames of ``bench.stream_bench`` (x4, HR patch 192, batch 16, 2 DataLoader workers):

* **BasicSR's recipe** (our code, following BasicSR's documented DIV2K steps): every frame cut into
  sub-images of 480 px every 240 px (LR: 120 every 60: 120 sub-images per 3840x2160 frame), each
  stored PNG-encoded (compression 1) in an LMDB; a map-style Dataset in the ``PairedImageDataset``
  way: cv2 decode of one sub-image pair per patch, float32, aligned random crop, random h/v flips and
  transpose, BGR->RGB, CHW float32 tensors; DataLoader with ``shuffle=True``. The build time and the
  bytes on disk are reported. A variant stops before the float32 conversion (uint8 patches).
* **Plain WebDataset** on our PNG shards: ``wds.WebDataset(...).decode("rgb8")``, a cutter of k=16
  aligned random patches (random flips), ``shuffle(1024)``, ``batched(16)``.
* **wdsr**: PNG and QOI at k=16 and at k=120 (the patches per frame per epoch that BasicSR's
  sub-images give), and PNG with the node-wide decoded cache warm (k=16 and k=120).

Ratios are against BasicSR's recipe as it ships (float32 patches). Every dataset is read into the
page cache first, through one reused buffer. Every loader's DataLoader workers run with the malloc
settings wdsr's workers set (``wdsr.loader.tune_malloc``: large freed blocks stay in the heap);
without them a worker's glibc starts from its defaults, or from whatever state it inherits from the
bench process; the row "BasicSR recipe, float32, glibc defaults" shows the defaults.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path

import cv2
import lmdb
import numpy as np
import torch
import webdataset as wds

from bench.basicsr_crop import paired_crop
from bench.common import COLUMNS, machine_line, md_table, parser, report, shards, warm_page_cache
from shardmaker import format as fmt
from wdsr.loader import tune_malloc
from wdsr.tools.bench import BenchResult, bench_stream, fill_decoded_cache

BATCH, PATCH, SCALE, WORKERS = 16, 192, 4, 2


# ---- BasicSR's recipe ------------------------------------------------------------------------
def _starts(n: int, crop: int, step: int) -> list[int]:
    """Sub-image origins along one side, as BasicSR's extract_subimages lays them out (thresh_size 0)."""
    s = list(range(0, n - crop + 1, step))
    if n - (s[-1] + crop) > 0:
        s.append(n - crop)
    return s


def build_lmdb(ours: str, out: Path) -> tuple[Path, Path, float, int]:
    """HR and LR sub-images of every frame (decoded from our PNG shards) into two LMDBs."""
    hr_db, lr_db = out / "hr.lmdb", out / "lr.lmdb"
    meta = out / "meta.json"
    if meta.exists():
        m = json.loads(meta.read_text())
        return hr_db, lr_db, m["seconds"], m["bytes"]
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    m = fmt.load(ours)
    t0 = time.perf_counter()
    envs = {db: lmdb.open(str(db), map_size=1 << 40) for db in (hr_db, lr_db)}
    keys = []
    for info in m.shards:
        with open(Path(ours) / info.name, "rb") as f:
            for key, _, members in fmt.iter_samples(f):
                hr = cv2.imdecode(np.frombuffer(members[fmt.hr_member("png")], np.uint8), cv2.IMREAD_COLOR)
                lr = cv2.imdecode(np.frombuffer(members[fmt.lr_member(SCALE, "png")], np.uint8), cv2.IMREAD_COLOR)
                hr = hr[: SCALE * lr.shape[0], : SCALE * lr.shape[1]]
                txn_hr, txn_lr = envs[hr_db].begin(write=True), envs[lr_db].begin(write=True)
                n = 0
                for y in _starts(hr.shape[0], 480, 240):
                    for x in _starts(hr.shape[1], 480, 240):
                        name = f"{key}_s{n:03d}".encode()
                        ok1, hr_png = cv2.imencode(".png", hr[y : y + 480, x : x + 480], [cv2.IMWRITE_PNG_COMPRESSION, 1])
                        ly, lx = y // SCALE, x // SCALE
                        ok2, lr_png = cv2.imencode(".png", lr[ly : ly + 120, lx : lx + 120], [cv2.IMWRITE_PNG_COMPRESSION, 1])
                        assert ok1 and ok2
                        txn_hr.put(name, hr_png.tobytes())
                        txn_lr.put(name, lr_png.tobytes())
                        keys.append(name.decode())
                        n += 1
                txn_hr.commit()
                txn_lr.commit()
    for env in envs.values():
        env.close()
    seconds = time.perf_counter() - t0
    size = sum(p.stat().st_size for db in (hr_db, lr_db) for p in db.iterdir())
    (out / "keys.txt").write_text("\n".join(keys) + "\n")
    meta.write_text(json.dumps({"seconds": seconds, "bytes": size, "subimages": len(keys)}))
    return hr_db, lr_db, seconds, size


def build_lmdb_apart(ours: str, out: Path) -> tuple[Path, Path, float, int]:
    """``build_lmdb`` in a forked child when the LMDB is missing: the build's freed buffers would move this
    process's malloc thresholds, which the loaders' forked workers inherit (the glibc-defaults row)."""
    if not (out / "meta.json").exists():
        child = multiprocessing.get_context("fork").Process(target=build_lmdb, args=(ours, out))
        child.start()
        child.join()
        if child.exitcode:
            raise SystemExit(f"building {out} failed (exit {child.exitcode})")
    return build_lmdb(ours, out)  # reads what the child wrote


class PairedLmdb(torch.utils.data.Dataset):
    """A sub-image pair per item, decoded with cv2, cropped and augmented the PairedImageDataset way."""

    def __init__(self, folder: Path, float32: bool = True) -> None:
        self.folder, self.float32 = folder, float32
        self.keys = (folder / "keys.txt").read_text().split()
        self.envs: tuple | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.envs is None:  # opened in the worker, read-only, as BasicSR's LmdbBackend does
            self.envs = tuple(
                lmdb.open(str(self.folder / n), readonly=True, lock=False, readahead=False) for n in ("hr.lmdb", "lr.lmdb")
            )
        key = self.keys[i].encode()
        imgs = []
        for env in self.envs:
            with env.begin(write=False) as txn:
                img = cv2.imdecode(np.frombuffer(txn.get(key), np.uint8), cv2.IMREAD_COLOR)
            imgs.append(img.astype(np.float32) / 255.0 if self.float32 else img)
        gt, lq = imgs
        lq_t, gt_t = paired_crop(gt, lq)
        return (lq_t.float(), gt_t.float()) if self.float32 else (lq_t, gt_t)


def bench_loader(name: str, loader_fn, seconds: float, warm_batches: int = 8) -> BenchResult:
    """patches/s of any loader over ``seconds`` after ``warm_batches`` (epochs restarted as needed)."""
    n, t0 = 0, None
    while True:
        for _ in loader_fn():
            n += 1
            if n == warm_batches:
                t0 = time.perf_counter()
            if t0 is not None and time.perf_counter() - t0 >= seconds:
                dt = time.perf_counter() - t0
                nan = float("nan")
                return BenchResult(
                    name, (n - warm_batches) * BATCH / dt, nan, nan, nan, nan, nan, nan, nan, nan, dt, n - warm_batches
                )


def _tuned(_worker_id: int) -> None:
    tune_malloc()  # what every wdsr worker does first (wdsr.loader._worker_init)


# ---- plain WebDataset -------------------------------------------------------------------------
def wds_patches(k: int):
    def cut(src):
        rng = np.random.default_rng()
        for sample in src:
            hr, lr = sample["hr.png"], sample[f"lr_x{SCALE}.png"]
            p = PATCH // SCALE
            for _ in range(k):
                y, x = rng.integers(0, lr.shape[0] - p + 1), rng.integers(0, lr.shape[1] - p + 1)
                a, b = lr[y : y + p, x : x + p], hr[SCALE * y : SCALE * (y + p), SCALE * x : SCALE * (x + p)]
                if rng.random() < 0.5:
                    a, b = a[:, ::-1], b[:, ::-1]
                if rng.random() < 0.5:
                    a, b = a[::-1], b[::-1]
                yield (
                    torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1))),
                    torch.from_numpy(np.ascontiguousarray(b.transpose(2, 0, 1))),
                )

    return cut


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--frames", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--decoded-cache", default="/dev/shm/wdsr-peers-bench")
    args = ap.parse_args()
    torch.set_num_threads(1)
    head = machine_line()
    work = Path(args.out)
    ours = shards(work, args.frames)
    lmdb_dir = work / "basicsr-lmdb"
    _, _, build_s, lmdb_bytes = build_lmdb_apart(ours["png"], lmdb_dir)
    os.sync()
    # every loader reads from the page cache, none from the disk
    warm_page_cache([*lmdb_dir.rglob("*.mdb"), *Path(ours["png"]).glob("*.tar"), *Path(ours["qoi"]).glob("*.tar")])
    ours_bytes = {c: fmt.load(u).bytes for c, u in ours.items()}
    res: list[BenchResult] = []

    basicsr = (
        (True, "BasicSR recipe (LMDB sub-images, float32)", _tuned),
        (False, "BasicSR recipe, uint8 (no float conversion)", _tuned),
        (True, "BasicSR recipe, float32, glibc defaults", None),
    )
    for f32, name, init in basicsr:
        ds = PairedLmdb(lmdb_dir, float32=f32)
        res.append(
            bench_loader(
                name,
                lambda ds=ds, init=init: torch.utils.data.DataLoader(
                    ds,
                    batch_size=BATCH,
                    shuffle=True,
                    num_workers=WORKERS,
                    persistent_workers=False,
                    drop_last=True,
                    worker_init_fn=init,
                ),
                args.seconds,
            )
        )

    urls = sorted(str(p) for p in Path(ours["png"]).glob("shard-*.tar"))
    pipe = lambda: torch.utils.data.DataLoader(  # noqa: E731
        wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker)
        .decode("rgb8")
        .compose(wds_patches(16))
        .shuffle(1024)
        .batched(BATCH),
        batch_size=None,
        num_workers=WORKERS,
        worker_init_fn=_tuned,
    )
    res.append(bench_loader("plain WebDataset (decode rgb8, k=16, shuffle 1024)", pipe, args.seconds))

    kw = dict(workers=WORKERS, batch_size=BATCH, patch_size=PATCH, scale=SCALE, seconds=args.seconds)
    for codec in ("png", "qoi"):
        for k in (16, 120):
            res.append(bench_stream(ours[codec], patches_per_image=k, name=f"wdsr {codec.upper()} k={k}", **kw))
    shutil.rmtree(args.decoded_cache, ignore_errors=True)
    n, fill_s = fill_decoded_cache(ours["png"], SCALE, args.decoded_cache, None, WORKERS)
    cache_bytes = sum(p.stat().st_size for p in Path(args.decoded_cache).rglob("*.pair"))
    for k in (16, 120):
        res.append(
            bench_stream(
                ours["png"],
                patches_per_image=k,
                decoded_cache=args.decoded_cache,
                name=f"wdsr PNG k={k}, decoded cache warm",
                **kw,
            )
        )
    shutil.rmtree(args.decoded_cache, ignore_errors=True)

    base = res[0].patches_per_s
    by = {r.name: r.patches_per_s for r in res}
    glibc = by["BasicSR recipe, float32, glibc defaults"]

    ms, ceil = COLUMNS["ms/patch"][1], COLUMNS["of ceiling"][1]
    rows = [(r.name, f"{r.patches_per_s:.1f}", f"**{r.patches_per_s / base:.2f}x**", ms(r), ceil(r)) for r in res]
    cached = by["wdsr PNG k=16, decoded cache warm"] / by["wdsr PNG k=16"]
    lines = [
        f"{head}; {args.frames} 4K frames, x4, HR patch 192, batch 16, {WORKERS} workers, {args.seconds:.0f} s per loader:",
        "",
        md_table(["loader", "patches/s", "/ BasicSR recipe", "ms/patch", "of ceiling"], rows),
        "",
        f"- BasicSR's LMDB: {lmdb_bytes / 1e9:.2f} GB ({lmdb_bytes / ours_bytes['png']:.1f}x our PNG shards, "
        f"{ours_bytes['png'] / 1e9:.2f} GB; QOI {ours_bytes['qoi'] / 1e9:.2f} GB), built in {build_s:.0f} s "
        f"from decoded frames (the sub-image pass that precedes it not counted)",
        f"- decoded cache: {n} pairs, {cache_bytes / 1e9:.2f} GB on tmpfs, filled in {fill_s:.1f} s (one decode per frame)",
        f"- decoded cache warm / wdsr PNG k=16 uncached: **{cached:.1f}x**",
        f"- against BasicSR's recipe with glibc's defaults in its workers ({glibc:.1f} patches/s): "
        + ", ".join(
            f"{name} **{v / glibc:.2f}x**"
            for name, v in by.items()
            if name.startswith("wdsr") and "k=120" in name and "cache" not in name
        ),
    ]
    report(work, "peers", "\n".join(lines), [r.__dict__ for r in res])
    return 0


if __name__ == "__main__":
    sys.exit(main())
