"""A training run's folder (local path or fsspec URL): checkpoints, the ``latest.json`` pointer, metrics.

Layout: ``OUT/run.json`` (the run's settings), ``OUT/checkpoints/step-00001000.pt``,
``OUT/latest.json`` (``{"step", "path"}``, written after the checkpoint it names is complete),
``OUT/metrics.jsonl``. Local files are written to a temp name and renamed; on object stores an
object appears only when its upload completes, and the pointer is written after it. Checkpoints
are read with ``torch.load(weights_only=True)``: tensors and plain values only, never pickled code.
"""

from __future__ import annotations

import io
import json
import logging
import posixpath
import re
from typing import Any

import torch

from shardmaker import storage

log = logging.getLogger("wdsr")
FORMAT = "wdsr-train/1"
_CKPT = re.compile(r"^step-(\d{8,})\.pt$")


class RunError(ValueError):
    """The run folder cannot be used as asked (another run's checkpoints, a mismatched resume)."""


class RunDir:
    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.fs, self.root = storage.open_dir(url, storage_options)
        self.local = storage.is_local(self.fs)

    def path(self, name: str) -> str:
        return storage.join(self.root, name)

    def _read_json(self, name: str) -> dict[str, Any] | None:
        try:
            d = json.loads(storage.read_bytes(self.fs, self.path(name)))
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as exc:
            raise RunError(f"{self.url}/{name}: not valid JSON ({exc.msg})") from None
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
        d = self._read_json("latest.json")
        if d is None:
            return None
        if not isinstance(d.get("path"), str) or not _CKPT.match(posixpath.basename(d["path"])) or ".." in d["path"]:
            raise RunError(f"{self.url}/latest.json: 'path' must name checkpoints/step-NNNNNNNN.pt, got {d.get('path')!r}")
        return d

    def checkpoints(self) -> list[str]:
        """Names of the finished checkpoints, oldest first."""
        try:
            found = self.fs.ls(self.path("checkpoints"), detail=False)
        except FileNotFoundError:
            return []
        names = [posixpath.basename(p.rstrip("/")) for p in found]
        return sorted(n for n in names if _CKPT.match(n))

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
        data = storage.read_bytes(self.fs, self.path(d["path"]))
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise RunError(f"{self.url}/{d['path']}: not a {FORMAT} checkpoint")
        return state

    def upload(self, name: str, data: bytes) -> None:
        """Put a whole file (e.g. metrics.jsonl kept locally for a remote run) into the run folder."""
        self._write(name, data)
