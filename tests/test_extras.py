"""Optional packages a command needs (issue 39): without them, one line and exit 2 naming the extra to
install (``pip install 'wdsr[video]'``), nothing written, never a traceback nor a silent fallback
that breaks a promise (a TIFF read region by region is never decoded whole instead).

The packages are installed here: each case runs the real command in a child process whose
``sys.path`` starts with a folder where the package's ``__init__`` raises ImportError, as a missing
package does."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shardmaker.errors import MissingExtraError, require_extra
from tests.helpers import ROOT, mosaic

pytestmark = pytest.mark.timeout(120)


def _without(tmp_path: Path, package: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    """``python -m CMD`` with ``package`` unimportable."""
    block = tmp_path / f"without-{package}"
    (block / package).mkdir(parents=True, exist_ok=True)
    (block / package / "__init__.py").write_text(f"raise ImportError('{package} is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(block), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", *cmd], env=env, capture_output=True, text=True, timeout=100, cwd=tmp_path)


def _one_line(proc: subprocess.CompletedProcess[str], extra: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"pip install 'wdsr[{extra}]'" in err, err
    return err


def test_a_jpeg_tiff_read_by_region_without_imagecodecs(tmp_path):
    """Over --region (512), a TIFF is read by region: its JPEG tiles need imagecodecs; without it the
    build stops (even with --on-error skip: no sample is to blame) instead of decoding it whole."""
    import tifffile

    src = tmp_path / "src"
    src.mkdir()
    tifffile.imwrite(src / "slide.tif", mosaic(520, 600), tile=(128, 128), compression="jpeg")
    out = tmp_path / "ds"
    proc = _without(
        tmp_path,
        "imagecodecs",
        "shardmaker",
        "-q",
        "build",
        str(src),
        str(out),
        "--scale",
        "2",
        "--region",
        "512",
        "--on-error",
        "skip",
    )
    err = _one_line(proc, "tiff")
    assert "slide.tif" in err and "JPEG" in err and "imagecodecs" in err
    assert not out.exists() or not any(out.iterdir())  # nothing written


def test_a_video_build_without_pyav(tmp_path):
    av = pytest.importorskip("av")
    src = tmp_path / "videos"
    src.mkdir()
    with av.open(str(src / "a.mkv"), "w") as c:
        st = c.add_stream("ffv1", rate=10)
        st.width, st.height, st.pix_fmt = 64, 48, "bgr0"
        for i in range(3):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 40 * i, np.uint8), format="rgb24")
            for p in st.encode(frame):
                c.mux(p)
        for p in st.encode():
            c.mux(p)
    out = tmp_path / "ds"
    err = _one_line(_without(tmp_path, "av", "shardmaker", "-q", "build", str(src), str(out), "--clips", "--scale", "2"), "video")
    assert "a.mkv" in err and "needs av" in err
    assert not out.exists()


def test_an_s3_url_without_s3fs(tmp_path):
    """fsspec's own ImportError, sorted by the error handler both command lines share (``wdsr`` alike:
    not run here, its start costs 3 s of torch import)."""
    err = _one_line(_without(tmp_path, "s3fs", "shardmaker", "-q", "info", "s3://bucket/ds"), "s3")
    assert "needs s3fs" in err


def test_the_demo_without_scikit_image(tmp_path):
    """``make demo``'s photos ship in scikit-image (the ``demo`` extra): one line, exit 2, nothing built."""
    err = _one_line(_without(tmp_path, "skimage", "shardmaker.demo", "--out", "d"), "demo")
    assert "the demo (its photos ship in scikit-image) needs scikit-image" in err, err
    assert not (tmp_path / "d" / "shards").exists()


def test_the_helper_names_the_extra_and_crosses_processes():
    with pytest.raises(MissingExtraError) as e:
        require_extra("wdsr_tests_no_such_module", "--tensorboard", package="tensorboard")
    assert str(e.value) == "--tensorboard needs tensorboard, which is not installed: pip install 'wdsr[tensorboard]'"
    assert isinstance(e.value, ValueError)  # bad settings: exit 2 in both command lines
    assert str(pickle.loads(pickle.dumps(e.value))) == str(e.value)  # raised in a build worker, shown by the parent
    assert require_extra("json", "x").dumps(1) == "1"
