"""PyTorch Lightning (2.2+): ``WdsrDataModule`` streams the train set, ``WdsrStats`` logs whether the
loader keeps up. See docs/integrations.md.

Resume: Lightning saves any train loader with ``state_dict``/``load_state_dict`` in its checkpoint
(``loops.fit_loop.state_dict.combined_loader``, from rank 0; wdsr's state is rank-agnostic) and
restores it before ``iter()``. Lightning bug #20550 drops that state when
``trainer.estimated_stepping_batches`` is read first (e.g. in ``configure_optimizers`` for OneCycleLR):
the loader is then built and started before the checkpoint's loops are restored, and the resumed
epoch would replay its first batches. So the data module also keeps the loader state in its own part
of the checkpoint, which Lightning restores before ``configure_optimizers``, and hands it to the
loader as the loader is built: the resume is exact either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch

import wdsr
from shardmaker.errors import brief
from wdsr import env
from wdsr.config import DatasetConfig
from wdsr.loader import LoaderStateError, SRLoader

__all__ = ["WdsrDataModule", "WdsrStats"]


class WdsrDataModule(pl.LightningDataModule):
    """``WdsrDataModule(url, scale=4, patch_size=192, ..., num_workers=8)``: the train loader of an
    ``SRDataset`` (its options by name; ``loader_options`` go to ``wdsr.make_loader``).

    The dataset is built in ``setup()``, after the process group exists, with the trainer's rank and
    world size; batches stay uint8 until on the device, where ``on_after_batch_transfer`` makes them
    float [0, 1]. Validation loaders are the LightningModule's (or a subclass's ``val_dataloader``)."""

    def __init__(
        self, url: str | list[str], *, num_workers: int = 4, loader_options: dict[str, Any] | None = None, **dataset_options: Any
    ) -> None:
        super().__init__()
        DatasetConfig.from_options(**dataset_options)  # a bad option fails here, not in setup() on every rank
        self.url, self.num_workers = url, num_workers
        self.dataset_options, self.loader_options = dataset_options, dict(loader_options or {})
        self.dataset: wdsr.SRDataset | None = None
        self.loader: SRLoader | None = None
        self._saved: dict[str, Any] | None = None  # a loader state from the checkpoint, for the loader being built
        self._degrader: wdsr.Degrader | None = None  # degrade=: made on the first batch's device

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.dataset is None:
            world = env.World(self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else None
            self.dataset = wdsr.SRDataset(self.url, world=world, **self.dataset_options)

    def train_dataloader(self) -> SRLoader:
        if self.dataset is None:
            raise RuntimeError("WdsrDataModule.train_dataloader() before setup('fit')")
        if self.loader is None:
            self.loader = wdsr.make_loader(self.dataset, num_workers=self.num_workers, **self.loader_options)
        if self._saved is not None:
            self.loader.load_state_dict(self._saved)
            self._saved = None
        return self.loader

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """uint8/uint16 tensors of a batch (a tuple or list) to float [0, 1], on the device; the rest as it is.
        With ``degrade=``, the train batch ``(hr, params[, keys])`` becomes ``(lr, hr[, keys])`` by ``wdsr.Degrader``."""
        cfg = self.dataset_options.get("degrade")
        if cfg is not None and isinstance(batch, (tuple, list)) and len(batch) >= 2 and isinstance(batch[1], dict):
            if self._degrader is None:
                self._degrader = wdsr.Degrader(cfg).to(batch[0].device)
            return (*self._degrader(batch[:2]), *batch[2:])
        if isinstance(batch, (tuple, list)):
            return type(batch)(_to_float(x) for x in batch)
        return _to_float(batch)

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self.loader.state_dict()} if self.loader is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue where :meth:`state_dict` was taken: ``{"loader": <the loader's state>}``, or ``{}``
        (saved before the loader was built: the run starts at its first batch). Anything else is a
        :class:`wdsr.loader.LoaderStateError` here, not an error in Lightning or a silent restart."""
        if not isinstance(state_dict, dict) or set(state_dict) - {"loader"}:
            raise LoaderStateError(f"WdsrDataModule state: expected {{'loader': ...}} from state_dict(), got {brief(state_dict)}")
        if "loader" in state_dict and not isinstance(state_dict["loader"], dict):
            raise LoaderStateError(
                f"WdsrDataModule state: 'loader' must be a loader's state_dict() (a dict), got {brief(state_dict['loader'])}"
            )
        self._saved = state_dict.get("loader")
        if self._saved is not None and self.loader is not None:  # already built: its next pass continues there
            self.loader.load_state_dict(self._saved)
            self._saved = None


def _to_float(x: Any) -> Any:
    return wdsr.to_float(x) if isinstance(x, torch.Tensor) and x.dtype in (torch.uint8, torch.uint16) else x


class WdsrStats(pl.Callback):
    """Logs ``data/wait`` (the share of each step spent waiting for its batch, 0..1: ``wdsr train``'s
    ``data_wait``) and ``data/patches_per_s`` (this rank's) to the trainer's logger, every step.
    ``clock``: a ``perf_counter``-like function (tests pass a fake one)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._last_end: float | None = None  # end of the previous step
        self._fetched: float | None = None  # when this step's batch arrived

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_end = self.clock()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        self._fetched = self.clock()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        end = self.clock()
        if self._last_end is not None and self._fetched is not None and end > self._last_end:
            step = end - self._last_end
            patches = len(batch[0]) if isinstance(batch, (tuple, list)) else len(batch)
            pl_module.log("data/wait", (self._fetched - self._last_end) / step, on_step=True, on_epoch=False)
            pl_module.log("data/patches_per_s", patches / step, on_step=True, on_epoch=False)
        self._last_end = end
