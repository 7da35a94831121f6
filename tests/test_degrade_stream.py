"""Degradations through the stream (issue 28): ``SRDataset(..., degrade=cfg)`` cuts HR patches at
the stored-LR positions, draws each patch's parameters from (seed, epoch, key, j), and hands out
``(hr, params)`` batches that ``wdsr.Degrader(cfg)`` turns into ``(lr, hr)``; the same parameters
on any worker count, world size and after a resume; tiled and HR-only datasets alike."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

import wdsr
from tests.helpers import build_shards, mosaic, photos, save
from wdsr import seeds
from wdsr.degrade import draw_params
from wdsr.env import World

CFG = wdsr.RealESRGANConfig(gt_size=96)
KW = dict(scale=4, patch_size=96, patches_per_image=6, batch_size=4, shuffle_buffer=8, seed=7, return_keys=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("degrade-src")
    src = root / "src"
    src.mkdir()
    for i, p in enumerate(photos()):
        save(src / f"p{i}.png", np.ascontiguousarray(p[: 290 + 11 * i, : 430 - 9 * i]))
    grey = root / "grey"
    grey.mkdir()
    save(grey / "g.png", np.ascontiguousarray(mosaic(200, 220)[..., 0]))
    return {
        "stored": build_shards(src, root / "stored", "--scale", "4", "--max-samples", "2"),
        "hr": build_shards(src, root / "hr", "--hr-only", "--max-samples", "2"),
        "tiled": build_shards(src, root / "tiled", "--hr-only", "--codec", "qoi", "--tiles", "64", "--max-samples", "2"),
        "grey": build_shards(grey, root / "grey-ds", "--hr-only"),
    }


def _ds(url: Path, **kw) -> wdsr.SRDataset:
    return wdsr.SRDataset(str(url), **{**KW, "degrade": CFG, **kw})


def _batches(ds: wdsr.SRDataset, workers: int = 0, state: dict | None = None) -> list[tuple]:
    loader = wdsr.make_loader(ds, num_workers=workers)
    if state is not None:
        loader.load_state_dict(state)
    return [(hr.clone(), {k: v.clone() for k, v in p.items()}, keys) for hr, p, keys in loader]


def _digest(t: torch.Tensor) -> str:
    return hashlib.blake2b(t.contiguous().numpy().tobytes(), digest_size=12).hexdigest()


def _rows(batches: list[tuple]) -> list[tuple[str, str, str]]:
    """(key, HR digest, parameters digest) per patch."""
    out = []
    for hr, params, keys in batches:
        for i, key in enumerate(keys):
            pd = hashlib.blake2b(b"".join(params[k][i].contiguous().numpy().tobytes() for k in sorted(params)), digest_size=12)
            out.append((key, _digest(hr[i]), pd.hexdigest()))
    return out


def _same(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) > 0 and _rows(a) == _rows(b)


def test_hr_patches_are_the_stored_positions_and_each_carries_its_own_draws(data):
    """The HR of a degrade batch is the stored-LR run's HR, patch for patch (stored LR not read, or
    not there: HR-only); every row's parameters are draw_params at (seed, epoch, key, j) of that patch."""
    stored = wdsr.SRDataset(str(data["stored"]), **KW)
    want = [(hr, keys) for _, hr, keys in wdsr.make_loader(stored, num_workers=0)]
    for url in (data["stored"], data["hr"]):
        got = _batches(_ds(url))
        assert len(got) == len(want) > 3
        for (hr, params, keys), (w_hr, w_keys) in zip(got, want, strict=True):
            assert keys == w_keys and hr.dtype == torch.uint8 and torch.equal(hr, w_hr)
            assert params["kernel1"].shape == (4, 21, 21) and params["noise_seed"].shape == (4, 2)
    hr, params, keys = got[0]
    for i, key in enumerate(keys):
        base = seeds.patch_base(KW["seed"], 0, key)
        mine = {k: v[i] for k, v in params.items()}
        drawn = [draw_params(CFG, seeds.degrade(base, j), 96) for j in range(KW["patches_per_image"])]
        assert sum(all(torch.equal(mine[k], d[k]) for k in d) for d in drawn) == 1, key  # its own j's draws, no other's


def test_degrader_takes_the_batch_as_the_loader_gives_it(data):
    hr, params, keys = _batches(_ds(data["hr"]))[0]
    lr, hr_f = wdsr.Degrader(CFG)((hr, params, keys))
    lr2, hr2 = wdsr.Degrader(CFG)(hr, params)
    assert lr.shape == (4, 3, 24, 24) and hr_f.shape == (4, 3, 96, 96) and lr.dtype == torch.float32
    assert torch.equal(lr, lr2) and torch.equal(hr_f, hr2)
    assert 0.0 <= float(lr.min()) and float(lr.max()) <= 1.0
    bs = wdsr.BSRGANConfig(gt_size=104)
    hr, params, _ = _batches(_ds(data["hr"], patch_size=104, degrade=bs))[0]
    lr, _ = wdsr.Degrader(bs)((hr, params))
    assert lr.shape == (4, 3, 26, 26)


def test_the_same_draws_on_any_worker_count_world_and_resume(data):
    """Worker counts and worlds change which slot a patch goes to, never its HR or parameters; a
    resume mid-epoch (a loader state, 2 workers) continues with the straight run's batches."""
    one = _batches(_ds(data["hr"]))
    by_hr = {h: p for _, h, p in _rows(one)}
    two = _batches(_ds(data["hr"]), workers=2)
    ranks = [r for rank in range(2) for r in _rows(_batches(_ds(data["hr"], world=World(rank, 2))))]
    for rows in (_rows(two), ranks):
        shared = [(h, p) for _, h, p in rows if h in by_hr]
        assert len(shared) >= 0.8 * len(rows) and all(by_hr[h] == p for h, p in shared)
    straight = _batches(_ds(data["hr"]), workers=2)
    assert _same(straight, two)
    loader = wdsr.make_loader(_ds(data["hr"]), num_workers=2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    del it
    assert _same(_batches(_ds(data["hr"]), workers=2, state=state), straight[3:])


def test_a_new_epoch_draws_new_parameters(data):
    ds = _ds(data["hr"])
    loader = wdsr.make_loader(ds, num_workers=0)
    first = _rows([(hr, p, k) for hr, p, k in loader])
    second = _rows([(hr, p, k) for hr, p, k in loader])
    assert {p for *_, p in first}.isdisjoint({p for *_, p in second})


def test_tiled_hr_only_gives_the_untiled_batches(data):
    """Tiled HR (QOI tiles of 64 px, patches across tile seams) gives the same batches as whole
    HR, under degrade= and under lr='bicubic' (LR made per patch from the tiles)."""
    assert _same(_batches(_ds(data["tiled"])), _batches(_ds(data["hr"])))
    kw = {**KW, "lr": "bicubic"}
    whole = list(wdsr.make_loader(wdsr.SRDataset(str(data["hr"]), **kw), num_workers=0))
    tiles = list(wdsr.make_loader(wdsr.SRDataset(str(data["tiled"]), **kw), num_workers=0))
    assert len(whole) == len(tiles) > 3
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(whole, tiles, strict=True))


def test_min_patch_std_rejects_flat_hr_patches(data):
    """With ``min_patch_std`` the HR patch's own std decides (there is no LR yet)."""
    got = _batches(_ds(data["hr"], min_patch_std=45.0, max_tries=8))
    stds = [float(hr[i].float().std()) for hr, _, _ in got for i in range(len(hr))]
    plain = [float(hr[i].float().std()) for hr, _, _ in _batches(_ds(data["hr"])) for i in range(len(hr))]
    assert np.mean(stds) > np.mean(plain) and np.mean([s >= 45.0 for s in stds]) > np.mean([s >= 45.0 for s in plain])


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(patch_size=128), r"patch_size=128 but degrade=RealESRGANConfig\(gt_size=96\)"),
        (dict(scale=2, patch_size=96), r"scale=2 but degrade=RealESRGANConfig\(scale=4\)"),
        (dict(lr="bicubic"), "degrade= makes the LR on the device; lr='bicubic'"),
        (dict(split="val"), "degrade= makes training pairs"),
        (dict(degrade="realesrgan"), "degrade must be a wdsr.RealESRGANConfig, wdsr.BSRGANConfig or wdsr.ArbitraryScaleConfig"),
    ],
)
def test_bad_degrade_options_are_one_clear_error(data, change, message):
    with pytest.raises(ValueError, match=message):
        _ds(data["hr"], **change)


def test_grey_datasets_are_refused_before_any_read(data):
    with pytest.raises(ValueError, match="degrade= takes RGB images; this dataset's have 1 channel"):
        _ds(data["grey"])


def test_arbitrary_scale_batches_from_the_stream(data):
    """``ArbitraryScaleConfig`` through the same slot: HR patches on the grid of its ``scale`` (1), one
    drawn scale per batch (row 0's), LR side ``floor(P / s + 0.5)``."""
    cfg = wdsr.ArbitraryScaleConfig(scale_range=(1.5, 4.0), gt_size=96)
    got = _batches(_ds(data["hr"], scale=1, degrade=cfg))
    sides = set()
    for hr, params, keys in got:
        lr, _ = wdsr.Degrader(cfg)((hr, params))
        s = float(params["scale"][0])
        assert lr.shape == (4, 3, int(96 / s + 0.5), int(96 / s + 0.5)) and 1.5 <= s <= 4.0
        sides.add(lr.shape[-1])
    assert len(sides) > 2


@pytest.mark.parametrize("workers", [0, 2])
def test_a_grey_sample_where_the_manifest_records_no_kind_is_skipped_alone(data, tmp_path, workers):
    """degrade= takes 8-bit RGB: where the manifest does not record the kind, a grey sample is refused
    from its header (never decoded, never the kind the other samples are held to) and skipped alone."""
    import io
    import json
    import shutil

    from PIL import Image

    from tests.helpers import rewrite

    ds_dir = tmp_path / "mixed-kinds"
    shutil.copytree(data["hr"], ds_dir)
    first = json.loads((ds_dir / "manifest.json").read_text())["shards"][0]["keys"][0]

    def grey(name: str, payload: bytes) -> tuple[str, bytes]:
        if not name.startswith(first + ".hr"):
            return name, payload
        out = io.BytesIO()
        Image.open(io.BytesIO(payload)).convert("L").save(out, format="PNG")
        return name, out.getvalue()

    rewrite(ds_dir, 0, grey)
    m = json.loads((ds_dir / "manifest.json").read_text())
    m.pop("channels"), m.pop("bit_depth")
    (ds_dir / "manifest.json").write_text(json.dumps(m))
    for idx in ds_dir.glob("*.idx"):
        idx.unlink()
    ds = _ds(ds_dir, on_error="skip", verify="none")
    got = _batches(ds, workers=workers)
    keys = {k for *_, ks in got for k in ks}
    assert first not in keys and len(keys) == 3, keys
    with pytest.raises(wdsr.SampleError, match="is 8-bit grey, but the dataset .* is 8-bit RGB \\(as degrade= takes\\)"):
        _batches(_ds(ds_dir, verify="none"))
