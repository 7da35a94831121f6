"""Video clips: wdsr's windows against BasicSR's video recipe, and 4K clips with tiled frames.

    .venv/bin/python -m bench.clips_bench [--seconds 20] [--out bench/out]

**REDS-style** (the first table): ``--clips`` clips of ``--frames`` 1280 x 720 frames, a pan across 4K
mosaics of real photos (``bench.common.mosaic_4k``), their x4 LR made MATLAB-exactly, written as PNG
frames in REDS's layout (``train_sharp/000/00000000.png``, ``train_sharp_bicubic/X4/000/...``). Then:

* **BasicSR's recipe** as its docs describe ``REDSRecurrentDataset`` with LMDB: every frame's PNG bytes
  in an LMDB (HR and LR, as ``scripts/data_preparation/create_lmdb.py`` makes them), one window per
  item: a random clip, interval, start (``randint(0, L - T * interval)``), T HR and T LR frames read
  and decoded with cv2 to float32 (``imfrombytes(float32=True)``), one paired random crop (gt 256) and
  flip/rotation, stacked to ``[T, C, H, W]`` float tensors; the DataLoader's default collation, 2 workers.
* **wdsr**: the same frames built by ``shardmaker build --clips --lr`` (PNG; QOI; QOI with 128 px
  tiles, so a window's crop decodes only the tiles it touches), streamed with
  ``clip=ClipConfig(frames=T, window="recurrent")``, k windows per decoded segment (k = 1: the same
  work per window as BasicSR, decode-wise; k = 8), 2 workers, uint8 batches.

T = 15, interval 1, gt 256, x4, batch 4; windows/s after a warm-up, the rows side by side in one run.

**4K clips** (the second table): SurgiSR4K-like clips of 3840 x 2160 frames built with ``--tiles 256``
(QOI), T = 5, gt 256, k = 8, 1 worker: windows/s and the worker's peak RSS.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from bench.common import machine_line, md_table, mosaic_4k, parser, real_photos, report
from shardmaker.imaging import Codec, downscale, encode
from wdsr.tools.bench import bench_stream

SCALE, GT, T, BATCH = 4, 256, 15, 4


def pan_clip(rng: np.random.Generator, frames: int, h: int, w: int, step: int) -> list[np.ndarray]:
    """``frames`` frames of ``h x w`` panning ``step`` px per frame across mosaics of real photos."""
    pics = real_photos()
    strip = np.concatenate([mosaic_4k(pics, rng) for _ in range(1 + (frames * step + w) // 3840)], axis=1)
    y = int(rng.integers(0, strip.shape[0] - h + 1))
    return [np.ascontiguousarray(strip[y : y + h, t * step : t * step + w]) for t in range(frames)]


def write_reds(root: Path, clips: int, frames: int) -> tuple[Path, Path]:
    hr, lr = root / "train_sharp", root / "train_sharp_bicubic" / "X4"
    if (hr / f"{clips - 1:03d}" / f"{frames - 1:08d}.png").exists():
        return hr, lr
    rng = np.random.default_rng(11)
    for c in range(clips):
        for t, f in enumerate(pan_clip(rng, frames, 720, 1280, 6)):
            for folder, img in ((hr, f), (lr, downscale(f, SCALE))):
                (folder / f"{c:03d}").mkdir(parents=True, exist_ok=True)
                (folder / f"{c:03d}" / f"{t:08d}.png").write_bytes(encode(img, Codec.PNG, 1))
    return hr, lr


def build_lmdb(hr: Path, lr: Path, out: Path) -> tuple[Path, float, int]:
    """HR and LR frames' PNG bytes in two LMDBs keyed ``000/00000000`` (BasicSR's REDS LMDB)."""
    import lmdb

    if (out / "meta.txt").exists():
        return out, 0.0, sum(f.stat().st_size for f in out.rglob("*.mdb"))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    lines = []
    for name, src in (("hr.lmdb", hr), ("lr.lmdb", lr)):
        env = lmdb.open(str(out / name), map_size=1 << 40)
        with env.begin(write=True) as txn:
            for p in sorted(src.glob("*/*.png")):
                txn.put(f"{p.parent.name}/{p.stem}".encode(), p.read_bytes())
        env.close()
    for c in sorted(hr.iterdir()):
        lines.append(f"{c.name} {len(list(c.glob('*.png')))}")
    (out / "meta.txt").write_text("\n".join(lines) + "\n")
    return out, time.perf_counter() - t0, sum(f.stat().st_size for f in out.rglob("*.mdb"))


class RedsRecurrentLmdb(torch.utils.data.Dataset):
    """BasicSR's ``REDSRecurrentDataset`` reading an LMDB, as its documentation describes it."""

    def __init__(self, folder: Path, enlarge: int = 1000) -> None:
        self.folder = folder
        self.clips = [(c, int(n)) for c, n in (line.split() for line in (folder / "meta.txt").read_text().split("\n") if line)]
        self.enlarge, self.envs = enlarge, None

    def __len__(self) -> int:
        return len(self.clips) * self.enlarge

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        import random

        import lmdb

        if self.envs is None:
            self.envs = tuple(lmdb.open(str(self.folder / n), readonly=True, lock=False, readahead=False) for n in ("hr.lmdb", "lr.lmdb"))
        clip, length = self.clips[i % len(self.clips)]
        interval = random.choice([1])
        start = random.randint(0, length - T * interval)
        keys = [f"{clip}/{f:08d}".encode() for f in range(start, start + T * interval, interval)]
        frames = []
        for env in self.envs:
            with env.begin(write=False) as txn:
                frames.append([cv2.imdecode(np.frombuffer(txn.get(k), np.uint8), cv2.IMREAD_COLOR).astype(np.float32) / 255.0 for k in keys])
        gts, lqs = frames
        p = GT // SCALE
        top, left = random.randint(0, lqs[0].shape[0] - p), random.randint(0, lqs[0].shape[1] - p)
        lqs = [x[top : top + p, left : left + p] for x in lqs]
        gts = [x[top * SCALE : (top + p) * SCALE, left * SCALE : (left + p) * SCALE] for x in gts]
        hflip, rot = random.random() < 0.5, random.random() < 0.5
        out = []
        for imgs in (lqs, gts):
            ts = []
            for img in imgs:
                if hflip:
                    img = cv2.flip(img, 1)
                if rot:
                    img = img.transpose(1, 0, 2)
                img = cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_BGR2RGB)
                ts.append(torch.from_numpy(img.transpose(2, 0, 1).copy()))
            out.append(torch.stack(ts))
        return out[0], out[1]


def windows_per_s(loader_fn, seconds: float, warm: int = 4) -> float:
    n, t0 = 0, None
    while True:
        for _ in loader_fn():
            n += 1
            if n == warm:
                t0 = time.perf_counter()
            if t0 is not None and time.perf_counter() - t0 >= seconds:
                return (n - warm) * BATCH / (time.perf_counter() - t0)


_BUILD = """
import sys
from shardmaker.cli import main
rc = main(sys.argv[1:])
print(next(x.split()[1] for x in open("/proc/self/status") if x.startswith("VmHWM:")))  # kB
sys.exit(rc)
"""


def build(args: list[str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _BUILD, "-q", "build", *args], check=True, capture_output=True, text=True)
    return time.perf_counter() - t0, int(proc.stdout.split()[-1]) / 1024


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--clips", type=int, default=12)
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("bench/out"))
    ap.add_argument("--no-4k", dest="four_k", action="store_false")
    args = ap.parse_args()
    import wdsr

    work = args.out / "clips"
    hr, lr = write_reds(work / "reds", args.clips, args.frames)
    db, lmdb_s, lmdb_bytes = build_lmdb(hr, lr, work / "reds-lmdb")
    ours = {}
    for codec, tiles in (("png", "off"), ("qoi", "off"), ("qoi", "128")):
        name = codec if tiles == "off" else f"{codec}-t{tiles}"
        out = work / f"reds-{name}"
        if not (out / "manifest.json").exists():
            build([str(hr), str(out), "--clips", "--lr", str(lr), "--codec", codec, "--tiles", tiles, "--workers", "2"])
        ours[name] = out
    rows, data = [], {}

    def basicsr():
        ds = RedsRecurrentLmdb(db)
        return torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2, drop_last=True, persistent_workers=False)

    rates = {"BasicSR REDSRecurrentDataset (LMDB PNG, cv2, float32)": windows_per_s(basicsr, args.seconds)}
    cc = wdsr.ClipConfig(frames=T, window="recurrent")
    for codec, k in (("png", 1), ("png", 8), ("qoi", 8), ("qoi-t128", 8)):
        r = bench_stream(str(ours[codec]), workers=2, batch_size=BATCH, patches_per_image=k, patch_size=GT, scale=SCALE,
                         seconds=args.seconds, shuffle_buffer=32, clip=cc)
        rates[f"wdsr clips {codec.upper().replace('-T', ', tiles ')}, k={k}"] = r.patches_per_s
        data[f"wdsr {codec} k={k}"] = {"windows_per_s": r.patches_per_s, "worker_peak_rss_mb": r.peak_rss_mb}
    base = next(iter(rates.values()))
    for name, rate in rates.items():
        rows.append([name, f"{rate:.1f}", f"**{rate / base:.1f}x**"])
    data["basicsr_windows_per_s"] = base
    data["lmdb_bytes"] = lmdb_bytes
    png_bytes = sum(f.stat().st_size for f in ours["png"].glob("*.tar"))
    text = [
        machine_line(),
        "",
        f"{args.clips} clips x {args.frames} frames of 1280x720, x4, T={T} recurrent windows, gt {GT}, batch {BATCH}, 2 workers",
        "",
        md_table(["loader", "windows/s", "vs BasicSR"], rows),
        "",
        f"- BasicSR's LMDB: {lmdb_bytes / 1e6:.0f} MB; wdsr's PNG shards {png_bytes / 1e6:.0f} MB",
    ]
    if args.four_k:
        src = work / "surg4k"
        if not (src / "case1" / "frame24.png").exists():
            rng = np.random.default_rng(5)
            for c in (1, 2):
                for t, f in enumerate(pan_clip(rng, 24, 2160, 3840, 8), start=1):
                    (src / f"case{c}").mkdir(parents=True, exist_ok=True)
                    (src / f"case{c}" / f"frame{t}.png").write_bytes(encode(f, Codec.PNG, 1))
        out = work / "surg4k-ds"
        b_s, b_mb = (0.0, 0.0)
        if not (out / "manifest.json").exists():
            b_s, b_mb = build([str(src), str(out), "--clips", "--scale", "4", "--codec", "qoi", "--tiles", "256", "--workers", "1"])
        r = bench_stream(str(out), workers=1, batch_size=BATCH, patches_per_image=8, patch_size=GT, scale=SCALE,
                         seconds=args.seconds, shuffle_buffer=32, clip=wdsr.ClipConfig(frames=5))
        text += [
            "",
            md_table(
                [
                    "4K clips (2 x 24 frames, tiled 256, QOI)",
                    "windows/s (T=5, k=8, 1 worker)",
                    "worker peak RSS / private MB",
                    "build s / peak MB",
                ],
                [["wdsr", f"{r.patches_per_s:.1f}", f"{r.peak_rss_mb:.0f} / {r.peak_private_mb:.0f}", f"{b_s:.0f} / {b_mb:.0f}"]],
            ),
        ]
        data["4k"] = {
            "windows_per_s": r.patches_per_s,
            "worker_peak_rss_mb": r.peak_rss_mb,
            "worker_peak_private_mb": r.peak_private_mb,
            "build_s": b_s,
            "build_peak_mb": b_mb,
        }
    report(args.out, "clips_bench", "\n".join(text), data)


if __name__ == "__main__":
    main()
