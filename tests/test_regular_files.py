"""Files that someone else could have replaced (issue 38, high 2): a FIFO, a directory or a device where a
manifest, a column index, a checkpoint or a run file should be is a clear error naming the path (exit 2
from the command lines), never a hang or an ``IsADirectoryError``; every local read goes through the one
regular-file opener (``shardmaker.storage.open_regular``), which the scan below keeps true."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import wdsr
from shardmaker import cli as sm_cli
from shardmaker import format as fmt
from shardmaker.format import colindex
from tests.helpers import build_shards, photos, save, sm
from wdsr.tools import cli as wdsr_cli

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
CHILD_TIMEOUT = 120  # only stops a hang (the old behaviour): a case ends in well under a second
CAP = 6 << 30  # address space of a child: torch loads in it; reading /dev/urandom whole does not
KINDS = {"fifo": "a FIFO", "dir": "a directory", "urandom": "a character device"}
NAMES = ("manifest.json", "manifest.json.idx")

# ---- the scan: no local read of a file outside the one opener -------------------------------------
# (file, what) allowed, and why
ALLOWED = {
    ("shardmaker/storage.py", "open()"): "the opener itself (open(fd) after the fstat check)",
    ("shardmaker/storage.py", "os.open()"): "the opener itself",
    ("shardmaker/storage.py", "fs.cat_file()"): "remote ranges only (read_range)",
    ("shardmaker/storage.py", "fs.open()"): "remote objects only (open_input)",
    ("shardmaker/format/colread.py", "fs.cat_file()"): "a remote index only (_mapped)",
    ("wdsr/store/remote.py", "self.fs.cat_file()"): "range reads from object storage",
    ("wdsr/pipeline/stats.py", "open()"): "/proc/self/smaps_rollup: the kernel's",
    ("shardmaker/demo.py", ".read_bytes()"): "the bundled photos, copied into our own temp folder",
}


def _mode(call: ast.Call) -> str | None:
    """The mode of an ``open``-like call when it is a constant ("r" when not given)."""
    given = call.args[1] if len(call.args) >= 2 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    if given is None:
        return "r"
    return given.value if isinstance(given, ast.Constant) and isinstance(given.value, str) else None


def _reads(call: ast.Call) -> str | None:
    """What the call is, if it reads a file by name without the opener."""
    f = call.func
    writes = (_mode(call) or "r").strip("rbt") != ""  # "wb", "a", "x", "r+": written, ours
    if isinstance(f, ast.Name):
        return "open()" if f.id == "open" and not writes else None
    if not isinstance(f, ast.Attribute):
        return None
    base, first = ast.unparse(f.value), call.args[0] if call.args else None
    in_memory = isinstance(first, ast.Call) and ast.unparse(first.func).endswith("BytesIO")
    if f.attr in ("read_bytes", "read_text") and not call.args:
        return f".{f.attr}()"
    if f.attr in ("cat_file", "cat") and base.endswith("fs"):
        return f"{base}.{f.attr}()"
    if f.attr == "open" and call.args and base not in ("storage", "tarfile", "av", "fsspec", "Image") and not writes:
        if base != "os" or ("O_RDONLY" in ast.unparse(call) and "O_DIRECTORY" not in ast.unparse(call)):
            return f"{base}.open()"
    if f.attr == "load" and base in ("torch", "np", "numpy", "json", "pickle") and not in_memory:
        return f"{base}.load()"
    if base == "yaml" and f.attr.endswith("load") and isinstance(first, ast.Name) and first.id in ("f", "fh", "file", "stream"):
        return f"yaml.{f.attr}(file)"
    return None


def bare_reads(package: str) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            what = _reads(node) if isinstance(node, ast.Call) else None
            if what and (rel, what) not in ALLOWED:
                out.append(f"{rel}:{node.lineno}: {what}")
    return out


@pytest.mark.parametrize("package", ["shardmaker", "wdsr"])
def test_every_local_read_goes_through_the_one_opener(package):
    """``open(path)``, ``Path.read_bytes()``, ``fs.open(path, "rb")``, ``torch.load(path)`` ... block on a
    FIFO and read a device without end: use ``shardmaker.storage`` (``open_regular``, ``open_input``,
    ``read_bytes``, ``read_local``, ``read_range``)."""
    assert bare_reads(package) == []


def test_the_scan_finds_a_bare_read():
    code = ["open(p)", "open(p, 'wb')", "Path(p).read_text()", "fs.open(p, 'rb')", "torch.load(p)", "torch.load(io.BytesIO(b))"]
    tree = ast.parse("\n".join([*code, "yaml.safe_load(f)", "yaml.safe_load(data)"]))
    found = [_reads(n) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert [w for w in found if w] == ["open()", ".read_text()", "fs.open()", "torch.load()", "yaml.safe_load(file)"]


# ---- behaviour ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """Three 32x32 samples, one per shard, with a column index (about the smallest dataset there is)."""
    src = tmp_path_factory.mktemp("tiny_src")
    for i in range(3):
        save(src / f"p{i}.png", photos()[i][:32, :32].copy())
    out = build_shards(src, tmp_path_factory.mktemp("tiny") / "ds", "--scale", "4", "--max-samples", "1")
    assert (Path(out) / "manifest.json.idx").is_file()
    return Path(out)


def _replace(path: Path, kind: str) -> None:
    """Put ``kind`` where the file ``path`` was."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        path.symlink_to("/dev/urandom")  # a link to a device: the link is followed, the device refused


def _hostile_sets(tiny: Path, tmp_path: Path) -> dict[tuple[str, str], Path]:
    sets = {}
    for name in NAMES:
        for kind in KINDS:
            ds = tmp_path / f"{name}-{kind}"
            shutil.copytree(tiny, ds)
            _replace(ds / name, kind)
            sets[name, kind] = ds
    return sets


def test_a_link_to_a_regular_manifest_and_index_still_works(tiny, tmp_path):
    """Users link datasets: links to regular files are followed as before."""
    ds = tmp_path / "ds"
    ds.mkdir()
    for f in tiny.iterdir():
        (ds / f.name).symlink_to(f)
    assert len(wdsr.SRDataset(str(ds), scale=4, patch_size=8, patches_per_image=1, batch_size=1)) == 3


_CASES = f"""
import contextlib, io, json, resource, sys
from importlib import import_module
resource.setrlimit(resource.RLIMIT_AS, ({CAP}, {CAP}))  # a device read without end stops here, not the machine
import wdsr
out = []
for module, argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        if module == "SRDataset":
            try:
                rc = wdsr.SRDataset(argv[0], scale=4, patch_size=8) and 0
            except ValueError as exc:
                rc = print(f"{{type(exc).__name__}}: {{exc}}", file=sys.stderr) or 2
        else:
            rc = import_module(module).main(argv)
    out.append([rc, err.getvalue()])
print(json.dumps(out))
"""


def _cases(cases: list[tuple[str, list[str]]]) -> list[tuple[int, str]]:
    """Run each ``(module, argv)``: ``module.main(argv)``, or ``SRDataset(argv[0])`` for "SRDataset", in one
    child process (one interpreter start for all) under a memory cap; the timeout only stops a hang."""
    proc = subprocess.run(
        [sys.executable, "-c", _CASES, json.dumps(cases)], capture_output=True, text=True, env=ENV, timeout=CHILD_TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [tuple(x) for x in json.loads(proc.stdout.splitlines()[-1])]


def test_dataset_info_and_train_check_end_at_once_naming_the_path(tiny, tmp_path):
    """Each of a FIFO, a directory and a link to /dev/urandom at manifest.json and at manifest.json.idx:
    ``SRDataset`` raises a ManifestError, ``shardmaker info`` and the Kubernetes pre-flight
    ``wdsr train --check`` end at once with exit 2 and one line naming the path."""
    sets = _hostile_sets(tiny, tmp_path)
    check = ["--out", str(tmp_path / "run"), "--scale", "4", "--patch-size", "16", "--steps", "1"]
    cases = [("SRDataset", [str(ds)]) for ds in sets.values()]
    cases += [("shardmaker.cli", ["info", str(ds)]) for ds in sets.values()]
    cases += [("wdsr.tools.cli", ["train", "--check", "--data", str(ds), *check]) for ds in sets.values()]
    got = _cases(cases)
    for i, (name, kind) in enumerate(sets):
        want = f"{sets[name, kind] / name}: is {KINDS[kind]}, not a regular file"
        for who, (rc, err) in zip(("SRDataset", "info", "train --check"), got[i :: len(sets)], strict=True):
            assert rc == 2 and want in err and len(err.splitlines()) == 1, (who, name, kind, err)
        assert got[i][1].startswith("ManifestError: ")


@pytest.mark.timeout(CHILD_TIMEOUT + 30)
def test_the_shardmaker_process_exits_2_on_a_fifo_at_the_manifest(tiny, tmp_path):
    """The real process (what a Kubernetes Job runs): exit status 2, not a hang."""
    ds = tmp_path / "ds"
    shutil.copytree(tiny, ds)
    _replace(ds / "manifest.json", "fifo")
    cmd = [sys.executable, "-m", "shardmaker", "info", str(ds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=CHILD_TIMEOUT)
    assert proc.returncode == 2 and proc.stderr.strip().endswith(f"{ds}/manifest.json: is a FIFO, not a regular file")


def test_info_says_whether_the_reader_uses_the_column_index(tiny, tmp_path, capsys):
    main = sm_cli.main
    ds = tmp_path / "ds"
    shutil.copytree(tiny, ds)
    assert main(["info", str(ds)]) == 0
    assert "index      manifest.json.idx (the reader maps it;" in capsys.readouterr().out
    (ds / "manifest.json.idx").unlink()
    assert main(["info", str(ds)]) == 0
    assert "index      none (the reader parses manifest.json)" in capsys.readouterr().out


@pytest.fixture(scope="module")
def tiny_run(tiny, tmp_path_factory) -> Path:
    """A finished one-step run of the smallest model."""
    out = tmp_path_factory.mktemp("run") / "run"
    argv = ["train", "--data", str(tiny), "--out", str(out), "--model", "espcn", "--scale", "4", "--patch-size", "8"]
    argv += ["-k", "1", "--batch-size", "1", "--workers", "0", "--steps", "1"]
    with contextlib.redirect_stderr(io.StringIO()):
        assert wdsr_cli.main(argv) == 0
    return out


RUN_FILES = ("latest.json", "run.json", "checkpoints/step-00000001.pt", "metrics.jsonl")


def test_resume_and_upscale_refuse_a_fifo_at_a_run_file(tiny, tiny_run, tmp_path):
    """A FIFO at the checkpoint, ``latest.json``, ``run.json`` or ``metrics.jsonl``: ``wdsr train --resume``
    and ``wdsr upscale`` (of the run folder, and of the checkpoint file) end at once, exit 2, naming it
    (run.json and metrics.jsonl are not upscale's: it upscales)."""
    image = tmp_path / "x.png"
    save(image, photos()[0][:16, :16].copy())
    resume, upscale = [], []
    for i, name in enumerate(RUN_FILES):
        run = tmp_path / f"run{i}"
        shutil.copytree(tiny_run, run)
        _replace(run / name, "fifo")
        resume.append(["train", "--resume", "--data", str(tiny), "--out", str(run), "--model", "espcn", "--scale", "4"])
        resume[-1] += ["--patch-size", "8", "-k", "1", "--batch-size", "1", "--workers", "0", "--steps", "1"]  # as saved: no override line
        upscale.append(["upscale", str(run), str(image), "-o", str(tmp_path / f"up{i}")])
    upscale.append(["upscale", str(tmp_path / "run2" / RUN_FILES[2]), str(image), "-o", str(tmp_path / "up")])
    got = _cases([("wdsr.tools.cli", argv) for argv in resume + upscale])
    wants = [f"run{i}/{name}: is a FIFO, not a regular file" for i, name in enumerate(RUN_FILES)]
    for (rc, err), want in zip(got[: len(RUN_FILES)], wants, strict=True):
        assert rc == 2 and want in err and len(err.splitlines()) == 1, (want, err)
    for (rc, err), want in zip(got[len(RUN_FILES) :], [wants[0], None, wants[2], None, wants[2]], strict=True):
        if want is None:  # not read by upscale: it upscales
            assert rc == 0, err
        else:
            assert rc == 2 and want in err and len(err.splitlines()) == 1, (want, err)


# ---- the column index against its manifest (issue 38, M8) --------------------------------------
def test_verify_checks_the_index_against_the_manifest_column_by_column(tiny, tmp_path, capsys):
    """An index that names the real manifest (its size, probe and digest) but drops a shard: the reader
    would stream 2 of 3 samples; ``verify`` says so. A truncated index, which the reader refuses, too."""
    ds = tmp_path / "ds"
    shutil.copytree(tiny, ds)
    data, idx = (ds / "manifest.json").read_bytes(), ds / "manifest.json.idx"
    m = fmt.parse(data, "manifest.json")
    assert sm(capsys, "verify", str(ds))[0] == 0
    fewer = dataclasses.replace(m, shards=[m.shards[0], m.shards[2]])
    idx.write_bytes(colindex.encode(fewer, data))
    assert wdsr.SRDataset(str(ds), scale=4, patch_size=8).manifest.samples == 2  # what the reader trusts
    rc, _, err = sm(capsys, "verify", str(ds))
    assert rc == 1 and f"MISMATCH manifest.json.idx: lists 2 shards; the manifest's {m.shards[1].name} missing" in err
    assert "MISMATCH manifest.json.idx: samples: 2 where the manifest has 3" in err
    moved = dataclasses.replace(m.shards[1], sha256="0" * 64)  # one column of one shard differs
    idx.write_bytes(colindex.encode(dataclasses.replace(m, shards=[m.shards[0], moved, m.shards[2]]), data))
    rc, _, err = sm(capsys, "verify", str(ds))
    assert (
        rc == 1
        and err.splitlines()[0] == f"MISMATCH manifest.json.idx: shard {m.shards[1].name}: sha256 differs from the manifest's"
    )
    whole = colindex.encode(m, data)
    idx.write_bytes(whole[: len(whole) - 64])
    with pytest.raises(fmt.ManifestError, match="must lie inside the file"):
        wdsr.SRDataset(str(ds), scale=4, patch_size=8)
    rc, _, err = sm(capsys, "verify", str(ds))
    assert rc == 1 and err.startswith(f"MISMATCH {idx}: ") and "must lie inside the file" in err
