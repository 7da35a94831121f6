"""`wdsr upscale` with a tiny ESPCN trained by `wdsr train` on real photo shards: tiled equals whole,
8/16-bit and grey round trips, --hr scores, bad input is one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from shardmaker import imaging
from shardmaker.imaging import Codec
from tests.helpers import photos, save
from wdsr.metrics import psnr_y, ssim_y
from wdsr.tools import upscale
from wdsr.tools.cli import main
from wdsr.tools.upscale import load_model, read_image, upscale_image

TRAIN = [
    "--model",
    "espcn",
    "--scale",
    "4",
    "--patch-size",
    "48",
    "-k",
    "4",
    "--batch-size",
    "4",
    "--workers",
    "0",
    "--shuffle-buffer",
    "16",
    "--lr",
    "1e-3",
    "--steps",
    "12",
    "--log-every",
    "3",
    "--ckpt-every",
    "6",
    "--val-every",
    "6",
    "--val-tile",
    "32",
]


_RUNS: dict[str, Path] = {}


def trained_run(photo_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny real run (12 ESPCN steps, validated) for the whole module; a plain helper, as fixtures
    live in conftest.py."""
    if str(photo_shards) not in _RUNS:
        out = tmp_path_factory.mktemp("upscale_run") / "run"
        assert main(["train", "--data", str(photo_shards), "--val-data", str(photo_shards), "--out", str(out), *TRAIN]) == 0
        _RUNS[str(photo_shards)] = out
    return _RUNS[str(photo_shards)]


def _lr_photo(h: int = 90, w: int = 131) -> np.ndarray:
    return np.ascontiguousarray(photos()[1][40 : 40 + h, 60 : 60 + w])  # chelsea, a real photo


def _close(a: np.ndarray, b: np.ndarray, top: float) -> tuple[float, float]:
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    mse = float(np.mean(diff**2))
    return float(diff.max()), (float("inf") if mse == 0 else 10 * np.log10(top**2 / mse))


def test_tiled_through_the_cli_equals_the_model_on_the_whole_image(photo_shards, tmp_path_factory, tmp_path, capsys):
    run = trained_run(photo_shards, tmp_path_factory)
    src = save(tmp_path / "in" / "cat.png", _lr_photo())
    rc = main(
        ["upscale", str(run), str(src.parent), "-o", str(tmp_path / "out"), "--tile", "40", "--overlap", "8", "--device", "cpu"]
    )
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "espcn x4, step 12" in text and "cat.png: 524x360" in text
    tiled = read_image(tmp_path / "out" / "cat.png")
    m = load_model(str(run))
    with torch.no_grad():  # the model on the whole image, by hand: no tiles, no wdsr code in between
        x = torch.from_numpy(_lr_photo()).permute(2, 0, 1)[None].float() / 255
        whole = (m.model(x)[0].clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    assert tiled.shape == whole.shape == (360, 524, 3) and tiled.dtype == np.uint8
    worst, psnr = _close(tiled, whole, 255)
    assert psnr > 40 and worst <= 1, (psnr, worst)  # context overlap//2 = 4 px covers ESPCN: float rounding only
    assert np.array_equal(upscale_image(m, _lr_photo(), tile=None), whole)
    assert np.array_equal(upscale_image(m, _lr_photo(), tile=40, overlap=8), tiled)


def test_16_bit_in_16_bit_out_and_grey_stays_grey(photo_shards, tmp_path_factory, tmp_path, capsys):
    run = trained_run(photo_shards, tmp_path_factory)
    lr8 = _lr_photo(60, 70)
    lr16 = lr8.astype(np.uint16) * 257 + (np.arange(70, dtype=np.uint16) % 200)[None, :, None]  # not x257 only
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "deep.png").write_bytes(imaging.encode(lr16, Codec.PNG))
    save(tmp_path / "in" / "grey.png", np.ascontiguousarray(lr8[:, :, 1]))
    rc = main(
        [
            "upscale",
            str(run / "checkpoints" / "step-00000012.pt"),
            str(tmp_path / "in" / "deep.png"),
            str(tmp_path / "in" / "grey.png"),
            "-o",
            str(tmp_path / "out"),
            "--tile",
            "24",
            "--overlap",
            "6",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    deep, grey = read_image(tmp_path / "out" / "deep.png"), read_image(tmp_path / "out" / "grey.png")
    assert deep.dtype == np.uint16 and deep.shape == (240, 280, 3)
    assert grey.dtype == np.uint8 and grey.shape == (240, 280)
    assert len(np.unique(deep)) > 4 * len(np.unique(deep >> 8))  # the low byte carries information
    m = load_model(str(run))
    eight = upscale_image(m, lr8, tile=24, overlap=6)
    worst, _ = _close(deep / 257.0, eight, 255)
    assert worst < 3  # the same picture at 8 bits (the 16-bit input differs by up to 200/65535)


def test_hr_reference_prints_psnr_and_ssim_per_image_and_the_mean(photo_shards, tmp_path_factory, tmp_path, capsys):
    run = trained_run(photo_shards, tmp_path_factory)
    hrs = {"a": photos()[0][100:340, 120:400], "b": photos()[2][50:250, 60:300]}
    for name, hr in hrs.items():
        save(tmp_path / "hr" / f"{name}.png", np.ascontiguousarray(hr))
        save(tmp_path / "lr" / f"{name}.png", imaging.downscale(np.ascontiguousarray(hr), 4))
    rc = main(
        ["upscale", str(run), str(tmp_path / "lr"), "-o", str(tmp_path / "sr"), "--hr", str(tmp_path / "hr"), "--tile", "32"]
    )
    cap = capsys.readouterr()
    text = cap.out
    assert rc == 0, cap.err
    sr = read_image(tmp_path / "sr" / "a.png")
    psnr, ssim = psnr_y(sr, hrs["a"], crop_border=4), ssim_y(sr, hrs["a"], crop_border=4)
    assert 15 < psnr < 40 and 0 < ssim < 1
    assert f"PSNR-Y {psnr:.3f} dB  SSIM-Y {ssim:.4f}" in text
    assert "mean over 2 images: PSNR-Y" in text


def _set5_like(root: Path) -> None:
    """HR ``baby.png``, ``head.png``; LR named as Set5 (``babyx4.png``) and as RCAN (``head_LRBI_x4.png``)."""
    for name, pic, lr_name in (("baby", 0, "babyx4"), ("head", 2, "head_LRBI_x4")):
        hr = np.ascontiguousarray(photos()[pic][40:90, 30:97])  # 67x50: a mod-crop of 3 and 2 px at x4
        save(root / "hr" / f"{name}.png", hr)
        save(root / "lr" / f"{lr_name}.png", imaging.downscale(np.ascontiguousarray(hr[:48, :64]), 4))


def test_hr_references_pair_like_shardmaker_build(photo_shards, tmp_path_factory, tmp_path, capsys):
    """``babyx4.png`` pairs with ``baby.png`` (DIV2K/Set5 naming), ``--lr-pattern`` as build's."""
    run = trained_run(photo_shards, tmp_path_factory)
    _set5_like(tmp_path)
    lr, hr = tmp_path / "lr", str(tmp_path / "hr")
    assert _upscale(run, str(lr / "babyx4.png"), "-o", str(tmp_path / "a"), "--hr", hr) == 0
    assert "PSNR-Y" in capsys.readouterr().out and (tmp_path / "a" / "babyx4.png").is_file()
    assert _upscale(run, str(lr), "-o", str(tmp_path / "b"), "--hr", hr, "--lr-pattern", "{stem}_LRBI_x{s}") == 2
    assert "babyx4.png: no HR image in" in capsys.readouterr().err  # with a pattern, only the pattern pairs
    assert (
        _upscale(run, str(lr / "head_LRBI_x4.png"), "-o", str(tmp_path / "b"), "--hr", hr, "--lr-pattern", "{stem}_LRBI_x{s}")
        == 0
    )
    assert "mean over 1 images" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["unpaired", "scale_in_name", "size"])
def test_hr_pairs_are_checked_before_anything_is_written(photo_shards, tmp_path_factory, tmp_path, capsys, case):
    run = trained_run(photo_shards, tmp_path_factory)
    _set5_like(tmp_path)
    lr = tmp_path / "lr"
    (lr / "head_LRBI_x4.png").unlink()
    bad = {"unpaired": "zebra.png", "scale_in_name": "headx2.png", "size": "head.png"}[case]
    img = np.ascontiguousarray(photos()[1][:12, :16])
    save(lr / bad, img if case != "size" else np.ascontiguousarray(photos()[1][:10, :16]))
    assert _upscale(run, str(lr), "-o", str(tmp_path / "out"), "--hr", str(tmp_path / "hr")) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and bad in err, err
    says = {"unpaired": "no HR image named zebra.*", "scale_in_name": "its name says x2", "size": "is not x4 the size"}[case]
    assert says in err, err
    assert not (tmp_path / "out").exists()  # babyx4.png comes first and pairs: still nothing written


@pytest.mark.parametrize("case", ["not_a_checkpoint", "foreign_checkpoint", "no_run", "missing_image", "no_hr"])
def test_bad_input_is_one_line_and_exit_2(photo_shards, tmp_path_factory, tmp_path, capsys, case):
    run = trained_run(photo_shards, tmp_path_factory)
    img = save(tmp_path / "x.png", _lr_photo(20, 20))
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    (tmp_path / "empty").mkdir()
    torch.save({"model": {}, "epoch": 3}, tmp_path / "other.pt")  # a checkpoint, but not one of wdsr train
    args, says = {
        "not_a_checkpoint": ([str(junk), str(img)], "not a readable checkpoint"),
        "foreign_checkpoint": ([str(tmp_path / "other.pt"), str(img)], "not a wdsr-train/1 checkpoint"),
        "no_run": ([str(tmp_path / "empty"), str(img)], "not a wdsr train run"),
        "missing_image": ([str(run), str(tmp_path / "nope.png")], "nope.png: no such file or folder"),
        "no_hr": ([str(run), str(img), "--hr", str(tmp_path / "empty")], "no HR image named x.*"),
    }[case]
    rc = main(["upscale", *args, "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and err.startswith("wdsr upscale: error:"), err
    assert says in err, err


def _tampered(run: Path, path: Path, edit) -> Path:
    """The run's newest checkpoint with ``edit(state)`` applied, saved at ``path``."""
    state = torch.load(sorted((run / "checkpoints").glob("step-*.pt"))[-1], weights_only=True)
    edit(state)
    torch.save(state, path)
    return path


def _conv(state: dict) -> str:
    return next(k for k, v in state["model"].items() if v.ndim == 4)


HOSTILE_CHECKPOINTS = {  # issue 38, M7: what a checkpoint claims is checked before the model is built
    "scale_2000": (lambda s: s["config"].update(scale=2000), "the checkpoint's scale must be an integer in [2, 64], got 2000"),
    "scale_float": (lambda s: s["config"].update(scale=4.0), "scale must be an integer in [2, 64], got 4.0"),
    "scale_true": (lambda s: s["config"].update(scale=True), "scale must be an integer in [2, 64], got True"),
    "scale_str": (lambda s: s["config"].update(scale="4"), "scale must be an integer in [2, 64], got '4'"),
    "other_scale": (lambda s: s["config"].update(scale=64), "weights do not fit espcn x64"),
    "unknown_model": (lambda s: s["config"].update(model="espcn-xl"), "model 'espcn-xl' is not one of edsr-baseline"),
    "bad_shape": (lambda s: s["model"].update({_conv(s): torch.zeros(2, 3, 1, 1)}), "in the file"),
    "not_a_tensor": (lambda s: s["model"].update({_conv(s): [1, 2]}), "not a tensor"),
    "channels": (lambda s: s["model"].update({_conv(s): torch.zeros(64, 5, 5, 5)}), "takes 5 channels"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_CHECKPOINTS))
def test_a_hostile_checkpoint_is_refused_before_the_model_is_built(
    photo_shards, tmp_path_factory, tmp_path, capsys, monkeypatch, case
):
    edit, says = HOSTILE_CHECKPOINTS[case]
    ckpt = _tampered(trained_run(photo_shards, tmp_path_factory), tmp_path / "ckpt.pt", edit)
    img = save(tmp_path / "x.png", _lr_photo(20, 20))
    built: list[tuple] = []
    real = upscale.build_model  # watched, not replaced: a model built before the refusal is the bug
    monkeypatch.setattr(upscale, "build_model", lambda *a, **k: built.append(a) or real(*a, **k))
    rc = main(["upscale", str(ckpt), str(img), "-o", str(tmp_path / "out"), "--tile", "0", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "ckpt.pt" in err and says in err, err
    assert built == [] and not (tmp_path / "out").exists()


# ---- outputs: an input is never replaced, an existing file only with --overwrite (issue 38, High 3) ----


def _upscale(run: Path, *args: str) -> int:
    return main(["upscale", str(run), *args, "--tile", "0", "--device", "cpu"])


@pytest.mark.parametrize("overwrite", [False, True])
def test_out_on_the_inputs_own_folder_is_refused_and_writes_nothing(photo_shards, tmp_path_factory, tmp_path, capsys, overwrite):
    run = trained_run(photo_shards, tmp_path_factory)
    photos_dir = tmp_path / "photos"
    save(photos_dir / "a.png", _lr_photo(20, 24))
    save(photos_dir / "b.jpg", _lr_photo(22, 20), quality=95)  # its target b.png is free: a.png decides
    before = {p.name: p.read_bytes() for p in photos_dir.iterdir()}
    rc = _upscale(run, str(photos_dir), "-o", str(photos_dir), *(["--overwrite"] if overwrite else []))
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{photos_dir / 'a.png'}: is the input {photos_dir / 'a.png'}" in err, err
    assert {p.name: p.read_bytes() for p in photos_dir.iterdir()} == before  # nothing replaced, nothing added


def test_an_existing_output_needs_overwrite(photo_shards, tmp_path_factory, tmp_path, capsys):
    run = trained_run(photo_shards, tmp_path_factory)
    src = save(tmp_path / "in" / "cat.png", _lr_photo(20, 24))
    out = tmp_path / "out"
    out.mkdir()
    (out / "cat.png").write_bytes(b"an earlier result")
    assert _upscale(run, str(src), "-o", str(out)) == 2
    err = capsys.readouterr().err
    assert f"{out / 'cat.png'}: exists; give --overwrite to replace it" in err and len(err.strip().splitlines()) == 1, err
    assert (out / "cat.png").read_bytes() == b"an earlier result"
    assert _upscale(run, str(src), "-o", str(out), "--overwrite") == 0
    assert read_image(out / "cat.png").shape == (80, 96, 3)
    assert sorted(p.name for p in out.iterdir()) == ["cat.png"]  # no temporary file left behind


def test_a_symlink_in_out_is_replaced_never_written_through(photo_shards, tmp_path_factory, tmp_path, capsys):
    run = trained_run(photo_shards, tmp_path_factory)
    src = save(tmp_path / "in" / "cat.png", _lr_photo(20, 24))
    outside = tmp_path / "elsewhere" / "precious.txt"
    outside.parent.mkdir()
    outside.write_bytes(b"not yours")
    out = tmp_path / "out"
    out.mkdir()
    (out / "cat.png").symlink_to(outside)
    assert _upscale(run, str(src), "-o", str(out)) == 2
    assert "exists; give --overwrite" in capsys.readouterr().err
    assert _upscale(run, str(src), "-o", str(out), "--overwrite") == 0
    assert outside.read_bytes() == b"not yours"
    assert not (out / "cat.png").is_symlink() and read_image(out / "cat.png").shape == (80, 96, 3)
    (out / "cat.png").unlink()
    (out / "cat.png").symlink_to(src)  # a link in OUT to an input: that input is never replaced
    before = src.read_bytes()
    assert _upscale(run, str(src), "-o", str(out), "--overwrite") == 2
    assert "is the input" in capsys.readouterr().err and src.read_bytes() == before
