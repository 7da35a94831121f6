"""``wdsr upscale``: a model trained by ``wdsr train`` applied to images of any size, tile by tile.

The image is cut into LR tiles overlapping by ``overlap`` (``tile_boxes``); each tile goes through the
model with ``overlap // 2`` more pixels of context on every side (where the image has them), cropped
away after, so a model that sees no farther than that gives the whole-image result (ESPCN: 4 px;
EDSR-baseline sees ~35 px, its remaining seam differences are averaged). One row of tiles at a time
is run and averaged back with ``stitch``; rows are averaged where they overlap, which equals
``stitch`` over all tiles while only one row of tiles is held. 8/16-bit and grey/RGB
in, the same depth and channels out (PNG).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import posixpath
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from shardmaker import imaging, storage
from shardmaker.errors import MissingExtraError, brief
from shardmaker.imaging import Codec
from wdsr.metrics import psnr_y, ssim_y
from wdsr.pipeline.tiles import stitch, tile_boxes
from wdsr.tools.ckptcheck import check_checkpoint
from wdsr.tools.references import IMAGE_EXTS, crop_reference, pair_references
from wdsr.train.checkpoint import FORMAT, MAX_STEP, RunDir, RunError, load_torch
from wdsr.train.models import build_model, residual_of
from wdsr.train.padding import padded
from wdsr.train.validate import super_resolve
from wdsr.train.zoo import ZooError, describe
from wdsr.train.zooload import FILE_SUFFIXES, detect, load_file, rebuilt, tensors_of


@dataclasses.dataclass
class Loaded:
    """A trained model ready to run, and where it came from."""

    model: nn.Module
    scale: int
    channels: int
    name: str  # the model's name (edsr-baseline, espcn)
    source: str  # the checkpoint's URL
    step: int
    config: dict[str, Any] = dataclasses.field(default_factory=dict)  # the checkpoint's config ({}: a model file)


def _read_state(source: str) -> tuple[Any, str, bool]:
    """``(what a .pt file or a run folder's newest checkpoint holds (latest.json, else the last name), its URL,
    whether it came from a run folder)``, read with ``weights_only``: tensors and plain values, never code."""
    fs, path = storage.open_dir(source)
    if not fs.exists(path):
        raise FileNotFoundError(f"{source}: no such checkpoint file or run folder")
    in_run = fs.isdir(path)
    if in_run:
        run = RunDir(source)
        latest = run.latest()
        names = run.checkpoints()
        if latest is not None:
            name = latest["path"]
        elif names:
            name = f"checkpoints/{names[-1]}"
        else:
            raise RunError(f"{source}: a folder without latest.json or checkpoints/step-*.pt (not a wdsr train run)")
        path, source = run.path(name), posixpath.join(source.rstrip("/"), name)
    data = storage.read_bytes(fs, path)  # a FIFO or a device there: an InputError naming it, never read
    try:
        state = load_torch(data)
    except Exception as exc:  # torch raises many types for a file that is not a checkpoint
        raise RunError(f"{source}: not a readable checkpoint ({type(exc).__name__}: {str(exc)[:120]})") from None
    return state, source, in_run


def _checked(state: Any, source: str) -> dict[str, Any]:
    """A ``wdsr train`` checkpoint's state: its format, step and finite weights checked."""
    if not isinstance(state, dict) or state.get("format") != FORMAT or not isinstance(state.get("model"), dict):
        raise RunError(f"{source}: not a {FORMAT} checkpoint (written by wdsr train)")
    step = state.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise RunError(f"{source}: 'step' must be an integer in [0, {MAX_STEP}], got {brief(step)}")
    if not all(torch.isfinite(v).all() for v in state["model"].values() if isinstance(v, torch.Tensor) and v.is_floating_point()):
        raise RunError(f"{source}: the weights hold inf or NaN (a diverged run); use an earlier checkpoint")
    return state


def load_model(source: str, device: torch.device | str = "cpu") -> Loaded:
    """Build the model a ``wdsr train`` checkpoint (file or run folder) names and load its weights; or any
    spandrel-loadable SR model file (``.pth``, ``.safetensors``: :mod:`wdsr.train.zoo`)."""
    if source.lower().endswith(FILE_SUFFIXES):
        return _loaded_file(load_file(source), source, device)
    found, where, in_run = _read_state(source)
    if not in_run and not (isinstance(found, dict) and "format" in found):  # a community .pt: a model file
        return _loaded_file(_community(found, where), where, device)
    state = _checked(found, where)
    if isinstance(state.get("config"), dict) and "spandrel" in state["config"]:
        return _load_zoo(state, where, device)
    name, scale, channels = check_checkpoint(state, where)  # before anything is built: the file is untrusted
    weights = state["model"]
    try:  # the checkpoint's variant (none: a run from before the field)
        residual = residual_of(state.get("config") or {}, where)
    except ValueError as exc:
        raise RunError(str(exc)) from None
    model = build_model(name, scale, channels, residual=residual)
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise RunError(f"{where}: weights do not fit {name} x{scale} ({str(exc)[:160]})") from None
    model.to(device).eval()
    return Loaded(model, scale, channels, name, where, int(state.get("step", 0)), _config(state))


def _community(found: Any, where: str) -> Any:
    """The spandrel descriptor of a ``.pt`` file that is not a wdsr checkpoint (no ``format`` key): a shared model."""
    try:
        return detect(tensors_of(found, where), where)
    except (ZooError, MissingExtraError) as exc:
        why = str(exc).removeprefix(f"{where}: ")
        what = f"not a {FORMAT} checkpoint (written by wdsr train), nor a model spandrel reads"
        raise RunError(f"{where}: {what} ({why})") from None


def _loaded_file(desc: Any, source: str, device: torch.device | str) -> Loaded:
    """A model file's spandrel descriptor, ready to run (padded to its size requirements)."""
    net = padded(desc.model, desc).to(device).eval()
    return Loaded(net, desc.scale, desc.input_channels, f"spandrel:{desc.architecture.id}", source, 0)


def _load_zoo(state: dict[str, Any], where: str, device: torch.device | str) -> Loaded:
    """A ``--model spandrel:NAME`` run's checkpoint: its architecture laid out on the meta device and held to
    the weights (nothing allocated for an untrusted record), then built, loaded and checked as spandrel sees it."""
    rec = state["config"]["spandrel"]
    net = rebuilt(rec, state["model"], where)
    try:
        net.load_state_dict(state["model"])
    except RuntimeError as exc:  # an architecture that could not be laid out first (SwinIR)
        raise RunError(f"{where}: weights do not fit spandrel {rec['arch']} ({str(exc)[:160]})") from None
    desc = describe(net, rec["arch"], where)
    model = padded(net, desc).to(device).eval()
    step = int(state.get("step", 0))
    return Loaded(model, desc.scale, desc.input_channels, f"spandrel:{rec['arch']}", where, step, _config(state))


def _config(state: dict[str, Any]) -> dict[str, Any]:
    config = state.get("config")
    return config if isinstance(config, dict) else {}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available here")
    return torch.device(name)


def _planes(img: np.ndarray, channels: int) -> torch.Tensor:
    """``HxW``/``HxWx3`` -> ``[N, channels, h, w]``: a grey model runs each colour plane, an RGB model a grey image x3."""
    chw = torch.from_numpy(np.ascontiguousarray(img if img.ndim == 3 else img[:, :, None])).permute(2, 0, 1)
    if chw.shape[0] == channels:
        return chw[None]
    if channels == 1:
        return chw[:, None]
    return chw.expand(channels, -1, -1)[None]


def _unplanes(sr: torch.Tensor, like: np.ndarray) -> torch.Tensor:
    """Inverse of ``_planes`` on the model's ``[N, C, H, W]`` float output: ``[C, H, W]`` with ``like``'s channels."""
    c = 1 if like.ndim == 2 else like.shape[2]
    if sr.shape[1] == c:
        return sr[0]
    if sr.shape[1] == 1:  # grey model, one plane per colour
        return sr[:, 0]
    return sr[0].mean(0, keepdim=True)  # RGB model on a grey image


def _to_int(sr: torch.Tensor, dtype: np.dtype) -> np.ndarray:
    top = 65535.0 if dtype == np.uint16 else 255.0
    q = (sr.float().clamp(0, 1) * top).round().to(torch.int32).numpy().astype(dtype)
    hwc = q.transpose(1, 2, 0)
    return np.ascontiguousarray(hwc[:, :, 0] if hwc.shape[2] == 1 else hwc)


def _band(m: Loaded, x: torch.Tensor, band: list[tuple[int, int, int, int]], pad: int, device: torch.device) -> torch.Tensor:
    """The SR of one row of LR tiles of ``x`` (``[C, h, w]``), each run with ``pad`` pixels of context on
    every side where the image has them and cropped back to its box: ``[T, C, s*th, s*tw]``."""
    s, (h, w) = m.scale, x.shape[1:]
    grown = [(max(y - pad, 0), max(bx - pad, 0), min(y + bh + pad, h), min(bx + bw + pad, w)) for y, bx, bh, bw in band]
    out: list[torch.Tensor | None] = [None] * len(band)
    for shape in sorted({(y1 - y0, x1 - x0) for y0, x0, y1, x1 in grown}):  # same-sized tiles in one pass
        idx = [i for i, (y0, x0, y1, x1) in enumerate(grown) if (y1 - y0, x1 - x0) == shape]
        sr = super_resolve(m.model, torch.stack([x[:, y0:y1, x0:x1] for y0, x0, y1, x1 in (grown[i] for i in idx)]), device)
        for j, i in enumerate(idx):
            (y, bx, bh, bw), (y0, x0, _, _) = band[i], grown[i]
            out[i] = sr[j, :, s * (y - y0) : s * (y - y0 + bh), s * (bx - x0) : s * (bx - x0 + bw)]
    return torch.stack([t for t in out if t is not None])


def _sr_tiled(m: Loaded, x: torch.Tensor, tile: int, overlap: int, device: torch.device) -> torch.Tensor:
    """``[N, C, h, w]`` LR -> ``[N, C, s*h, s*w]`` float SR, one row of tiles at a time."""
    n, c, h, w = x.shape
    s = m.scale
    boxes = tile_boxes(h, w, tile, overlap)
    out = torch.zeros((n, c, s * h, s * w), dtype=torch.float32)
    rows = torch.zeros((s * h, 1), dtype=torch.float32)
    for y in sorted({b[0] for b in boxes}):
        band = [b for b in boxes if b[0] == y]
        th = band[0][2]
        for i in range(n):
            sr = _band(m, x[i], band, overlap // 2, device)
            # every row of tiles has the same columns, so averaging whole rows equals averaging all tiles
            out[i, :, s * y : s * (y + th)] += stitch(sr, [(0, bx, bh, bw) for _, bx, bh, bw in band], s, (w, th))
        rows[s * y : s * (y + th)] += 1
    return out / rows


def upscale_image(
    m: Loaded, img: np.ndarray, tile: int | None = 256, overlap: int = 32, device: torch.device | None = None
) -> np.ndarray:
    """``HxW``/``HxWx3`` uint8/uint16 -> the model's ``s`` times larger image, same dtype and channels.

    ``tile`` is the LR tile side (None or 0: the whole image in one pass); tiles overlap by ``overlap``."""
    if img.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"expected an 8- or 16-bit image, got {img.dtype}")
    device = device or next(m.model.parameters()).device
    x = _planes(img, m.channels)
    h, w = x.shape[2:]
    if tile and (tile < h or tile < w):
        if overlap < 0 or overlap >= tile:
            raise ValueError(f"--overlap must be in 0..{tile - 1} (less than --tile), got {overlap}")
        sr = _sr_tiled(m, x, tile, overlap, device)
    else:
        sr = super_resolve(m.model, x, device)
    if not torch.isfinite(sr).all():  # finite weights can still overflow: never a black or white image, exit 0
        raise RunError(f"{m.source}: the model's output holds inf or NaN for this image; nothing written")
    return _to_int(_unplanes(sr, img), img.dtype)


def find_images(paths: list[str]) -> list[Path]:
    """Files as given, folders as the image files under them (sorted); a missing path is an error."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_EXTS)
            if not found:
                raise FileNotFoundError(f"{p}: no images ({', '.join(IMAGE_EXTS)}) in this folder")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    stems = [f.stem for f in out]
    dup = sorted({s for s in stems if stems.count(s) > 1})
    if dup:
        raise ValueError(f"two inputs would write the same OUT/{dup[0]}.png")
    return out


def read_image(path: Path) -> np.ndarray:
    try:
        return imaging.load_source(storage.read_local(str(path)), ext=path.suffix.lstrip(".").lower())
    except imaging.ImageDataError as exc:
        raise ValueError(f"{path}: {exc}") from None


@dataclasses.dataclass
class Result:
    name: str
    output: Path
    size: tuple[int, int]  # (w, h) of the output
    psnr_y: float | None = None
    ssim_y: float | None = None


def plan_outputs(images: list[Path], out: Path, overwrite: bool = False) -> list[Path]:
    """``out/<stem>.png`` for each image, checked before anything is written: a target that is one of
    the inputs (``-o`` on the inputs' own folder) is refused always, an existing one without ``overwrite``."""
    targets = [out / f"{p.stem}.png" for p in images]
    for target in targets:
        if not os.path.lexists(target):
            continue
        if target.is_dir():
            raise ValueError(f"{target}: a folder is where the upscaled image would go")
        same = next((p for p in images if target.exists() and os.path.samefile(target, p)), None)
        if same is not None:
            raise ValueError(f"{target}: is the input {same}; upscaling would replace it (choose another -o)")
        if not overwrite:
            raise ValueError(f"{target}: exists; give --overwrite to replace it")
    return targets


def part_name(target: Path, suffix: str = "") -> Path:
    """A temporary name beside ``target``, unique to this process and call, for :func:`commit_output`."""
    return target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part{suffix}"


def commit_output(tmp: Path, target: Path, overwrite: bool) -> None:
    """The complete ``tmp`` moved onto ``target`` (a symlink there is replaced, never written through);
    without ``overwrite``, only where nothing is, else a ValueError. The caller removes ``tmp`` after."""
    if overwrite:
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target)  # fails if anything appeared at target since it was checked
    except FileExistsError:
        raise ValueError(f"{target}: exists; give --overwrite to replace it") from None


def write_output(target: Path, data: bytes, overwrite: bool = False) -> None:
    """``data`` to a temporary name beside ``target``, then moved onto it: a reader never sees half a PNG, and a
    symlink at ``target`` is replaced, never written through. Without ``overwrite`` an existing target is an error."""
    tmp = part_name(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # a new file, the umask's mode, as a plain write
    try:
        with storage.naming(str(target)), os.fdopen(fd, "wb") as f:  # a full disk names the output
            f.write(data)
        commit_output(tmp, target, overwrite)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def upscale_files(
    m: Loaded,
    images: list[Path],
    out: Path,
    tile: int | None,
    overlap: int,
    hr_dir: Path | None = None,
    overwrite: bool = False,
    lr_pattern: str | None = None,
) -> list[Result]:
    """Upscale each image to ``out/<stem>.png``; with ``hr_dir``, PSNR-Y / SSIM-Y against its HR (paired by
    name as ``shardmaker build --lr`` pairs, ``lr_pattern`` as its ``--lr-pattern``). An input is never
    replaced, an existing file only with ``overwrite``; outputs and HR pairs are checked for all images
    before the first is written."""
    refs = pair_references(images, hr_dir, m.scale, lr_pattern) if hr_dir is not None else {}
    targets = plan_outputs(images, out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for path, target in zip(images, targets, strict=True):
        sr = upscale_image(m, read_image(path), tile, overlap)
        hr = None
        if path in refs:
            hr = crop_reference(read_image(refs[path]), refs[path], sr.shape, m.scale)
            if hr.dtype != sr.dtype:
                raise ValueError(f"{path}: {sr.dtype} input but a {hr.dtype} HR reference ({refs[path]})")
        write_output(target, imaging.encode(sr, Codec.PNG, 6), overwrite)
        r = Result(path.stem, target, (sr.shape[1], sr.shape[0]))
        if hr is not None:
            r.psnr_y, r.ssim_y = psnr_y(sr, hr, crop_border=m.scale), ssim_y(sr, hr, crop_border=m.scale)
        results.append(r)
    return results


def report(results: list[Result]) -> str:
    lines = []
    for r in results:
        line = f"{r.output}: {r.size[0]}x{r.size[1]}"
        if r.psnr_y is not None:
            line += f"  PSNR-Y {r.psnr_y:.3f} dB  SSIM-Y {r.ssim_y:.4f}"
        lines.append(line)
    scored = [r for r in results if r.psnr_y is not None and r.ssim_y is not None]
    if scored:
        psnrs = [r.psnr_y for r in scored if r.psnr_y is not None and math.isfinite(r.psnr_y)]
        mean_p = sum(psnrs) / len(psnrs) if psnrs else float("inf")
        mean_s = sum(r.ssim_y for r in scored if r.ssim_y is not None) / len(scored)
        lines.append(f"mean over {len(scored)} images: PSNR-Y {mean_p:.3f} dB  SSIM-Y {mean_s:.4f}")
    return "\n".join(lines)
