"""A training run's folder (local path or fsspec URL): checkpoints, the ``latest.json`` pointer, metrics.

Layout: ``OUT/run.json`` (the run's settings), ``OUT/checkpoints/step-00001000.pt``,
``OUT/latest.json`` (``{"step", "path"}``, written after the checkpoint it names is complete),
``OUT/metrics.jsonl``. Local files are written to a temp name and renamed; on object stores an
object appears only when its upload completes, and the pointer is written after it. Checkpoints
are read with ``torch.load(weights_only=True)`` (:func:`load_torch`, also for model files): tensors and plain values
only, never pickled code, and never a compressed zip entry.
Nothing read from OUT names a file outside it: ``latest.json``'s ``path`` must be exactly
``checkpoints/step-NNNNNNNN.pt`` (what :meth:`RunDir.save` writes), its ``step`` that number; a
checkpoint's fields are type-checked before use. Every problem is a one-line :class:`RunError`.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import posixpath
import re
import zipfile
from typing import Any

import torch

from shardmaker import storage
from shardmaker.errors import brief

log = logging.getLogger("wdsr")
FORMAT = "wdsr-train/1"
_CKPT = re.compile(r"step-([0-9]{8,18})\.pt")  # a checkpoint's file name (a step below 10**18)
_CKPT_PATH = re.compile(r"checkpoints/step-([0-9]{8,18})\.pt")  # latest.json's path: exactly this, under OUT
MAX_JSON_BYTES = 1 << 20  # latest.json and run.json are a few lines
MAX_STEP = 10**18 - 1
MAX_THREADS = 4096  # a checkpoint's intra-op thread count (``threads``)


class RunError(ValueError):
    """The run folder cannot be used as asked (another run's checkpoints, a mismatched resume)."""


class Diverged(RuntimeError):
    """The loss or the weights went inf/NaN: the run stops (exit 1) without checkpointing them, and the
    checkpoints written before are kept."""


def checkpoint_path(value: Any, where: str) -> tuple[str, int]:
    """``latest.json``'s ``path`` checked: exactly ``checkpoints/step-NNNNNNNN.pt`` (relative to OUT, no
    other folder, bucket or scheme), and the step it names. Anything else is a RunError naming ``where``."""
    m = _CKPT_PATH.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise RunError(f"{where}: 'path' must be checkpoints/step-NNNNNNNN.pt inside the run folder, got {brief(value)}")
    return value, int(m.group(1))


def _int_field(state: dict[str, Any], name: str, lo: int, hi: int, where: str) -> int:
    value = state.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise RunError(f"{where}: {name!r} must be an integer in [{lo}, {hi}], got {brief(value)}")
    return value


def check_state(state: Any, where: str) -> dict[str, Any]:
    """A loaded checkpoint's fields, type-checked (what the loop reads from it), before any is used."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise RunError(f"{where}: not a {FORMAT} checkpoint (written by wdsr train)")
    _int_field(state, "step", 0, MAX_STEP, where)
    _int_field(state, "epoch", 0, MAX_STEP, where)
    _int_field(state, "epoch_batches", 0, MAX_STEP, where)
    for name in ("model", "optimizer", "scheduler", "scaler", "rng", "config"):
        if not isinstance(state.get(name), dict):
            raise RunError(f"{where}: {name!r} must be a mapping, got {brief(state.get(name))}")
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state["model"].items()):
        raise RunError(f"{where}: 'model' must map parameter names to tensors")
    if not all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point()):
        raise RunError(f"{where}: the weights hold inf or NaN (a diverged run); resume from an earlier checkpoint")
    rng = state["rng"].get("torch")
    if not isinstance(rng, torch.Tensor) or rng.dtype != torch.uint8:
        raise RunError(f"{where}: 'rng.torch' must be a uint8 tensor (torch.get_rng_state())")
    if "threads" in state:  # the run's intra-op thread count (older checkpoints have none)
        _int_field(state, "threads", 1, MAX_THREADS, where)
    if state.get("loader") is not None and not isinstance(state["loader"], dict):
        raise RunError(f"{where}: 'loader' must be a mapping (a loader state_dict), got {brief(state['loader'])}")
    return state


def load_torch(data: bytes, map_location: Any = "cpu") -> Any:
    """``torch.load(weights_only=True)`` of untrusted bytes: tensors and plain values, never pickled code. A zip
    (torch's format since 1.6) whose entries unpack to more than the file holds is refused first: torch inflates a
    compressed entry whole (400 KB of file, a 400 MB tensor), and ``torch.save`` never compresses."""
    if data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                unpacked = sum(i.file_size for i in z.infolist())
        except (zipfile.BadZipFile, ValueError, EOFError) as exc:
            raise ValueError(f"a zip whose directory cannot be read ({str(exc)[:80]})") from None
        if unpacked > len(data):
            raise ValueError(f"its zip entries unpack to {unpacked} bytes from {len(data)} (compressed: not a torch.save file)")
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)


def _why(exc: BaseException) -> str:
    """What torch said about a file it could not load, in a few words (never its advice to unpickle)."""
    if isinstance(exc, pickle.UnpicklingError) or "weights_only" in str(exc):
        return "it holds objects other than tensors and plain values; checkpoints are loaded with weights_only=True"
    first = (str(exc).splitlines() or [""])[0][:160]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class RunDir:
    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.fs, self.root = storage.open_dir(url, storage_options)
        self.local = storage.is_local(self.fs)

    def path(self, name: str) -> str:
        return storage.join(self.root, name)

    def _read_json(self, name: str) -> dict[str, Any] | None:
        """A small JSON object of the run folder (``latest.json``, ``run.json``): at most ``MAX_JSON_BYTES``,
        a regular file (never a FIFO), parsed; None if absent."""
        path = self.path(name)
        try:
            with storage.open_input(self.fs, path) as f:
                data = f.read(MAX_JSON_BYTES + 1)
        except FileNotFoundError:
            return None
        except ValueError as exc:  # InputError: a FIFO or a device at the name
            raise RunError(str(exc)) from None
        if len(data) > MAX_JSON_BYTES:
            raise RunError(f"{self.url}/{name}: over {MAX_JSON_BYTES >> 20} MiB; not a file wdsr train wrote")
        try:
            d = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise RunError(f"{self.url}/{name}: not valid JSON ({str(exc)[:120]})") from None
        if not isinstance(d, dict):
            raise RunError(f"{self.url}/{name}: not a JSON object")
        return d

    def _write(self, name: str, data: bytes) -> None:
        path = self.path(name)
        if self.local:
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        storage.write_atomic(self.fs, path, data)

    # ---- run identity -------------------------------------------------------------------------
    def run_info(self) -> dict[str, Any] | None:
        return self._read_json("run.json")

    def has_checkpoints(self) -> bool:
        return self.latest() is not None or bool(self.checkpoints())

    def start(self, config: dict[str, Any]) -> None:
        """Record this run's settings (the caller has refused a folder holding another run)."""
        self._write("run.json", json.dumps({"format": FORMAT, "config": config}, indent=1).encode())

    # ---- checkpoints --------------------------------------------------------------------------
    def latest(self) -> dict[str, Any] | None:
        """``latest.json`` checked: ``{"step": N, "path": "checkpoints/step-N.pt"}`` (a name under OUT only)."""
        where = f"{self.url}/latest.json"
        d = self._read_json("latest.json")
        if d is None:
            return None
        path, step = checkpoint_path(d.get("path"), where)
        if d.get("step") != step or isinstance(d.get("step"), bool):
            raise RunError(f"{where}: 'step' must be {step}, the step its path names, got {brief(d.get('step'))}")
        return {"step": step, "path": path}

    def checkpoints(self) -> list[str]:
        """Names of the finished checkpoints, oldest first."""
        try:
            found = self.fs.ls(self.path("checkpoints"), detail=False)
        except FileNotFoundError:
            return []
        names = [posixpath.basename(p.rstrip("/")) for p in found]
        return sorted(n for n in names if _CKPT.fullmatch(n))

    def save(self, state: dict[str, Any], step: int, keep: int = 3) -> str:
        """Write ``state`` as ``checkpoints/step-N.pt``, then point ``latest.json`` at it; keep the last ``keep``."""
        buf = io.BytesIO()
        torch.save(state, buf)
        name = f"checkpoints/step-{step:08d}.pt"
        self._write(name, buf.getvalue())
        self._write("latest.json", json.dumps({"step": step, "path": name}).encode())
        if keep > 0:
            for old in self.checkpoints()[:-keep]:
                if old != posixpath.basename(name):
                    storage.discard(self.fs, self.path(f"checkpoints/{old}"))
        return storage.url_of(self.fs, self.path(name))

    def load_latest(self) -> dict[str, Any] | None:
        """The checkpoint ``latest.json`` names, on the CPU; None if there is none yet."""
        d = self.latest()
        if d is None:
            return None
        where = f"{self.url}/{d['path']}"
        try:
            data = storage.read_bytes(self.fs, self.path(d["path"]))
        except FileNotFoundError:
            raise RunError(f"{where}: named by latest.json but missing") from None
        try:
            state = load_torch(data)
        except Exception as exc:  # noqa: BLE001 - torch raises many types for a file that is not a checkpoint
            raise RunError(f"{where}: not a readable checkpoint ({_why(exc)})") from None
        check_state(state, where)
        if state["step"] != d["step"]:
            raise RunError(f"{where}: holds step {state['step']}, but latest.json says {d['step']}")
        return state

    def upload(self, name: str, data: bytes) -> None:
        """Put a whole file (e.g. metrics.jsonl kept locally for a remote run) into the run folder."""
        self._write(name, data)
