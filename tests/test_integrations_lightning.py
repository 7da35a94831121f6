"""``wdsr.integrations.lightning``: Lightning's own fit / checkpoint / resume with a ``WdsrDataModule``.

A run checkpointed mid-epoch and resumed sees exactly the batches an uninterrupted run sees after that
step, in one process and under ``strategy="ddp"`` (2 CPU processes, gloo, started by torchrun). The
module reads ``trainer.estimated_stepping_batches`` in ``configure_optimizers``: Lightning bug #20550
then drops the loader state Lightning itself saved, and only the data module's copy keeps the resume exact.

Run as ``python -m tests.test_integrations_lightning OUT URL`` (under torchrun) it is the DDP worker."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import subprocess
import sys
from itertools import count
from pathlib import Path

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from tests.helpers import ROOT  # noqa: E402
from tests.s3server import free_port  # noqa: E402
import wdsr  # noqa: E402
from wdsr.integrations.lightning import WdsrDataModule, WdsrStats  # noqa: E402

OPTIONS = {"scale": 4, "patch_size": 32, "patches_per_image": 4, "batch_size": 5, "shuffle_buffer": 16}


class Probe(pl.LightningModule):
    """Records what each training step gets: a digest of the batch, and its dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Conv2d(3, 3, 1)
        self.seen: list[str] = []
        self.dtypes: set[torch.dtype] = set()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        lr, hr = batch
        self.dtypes.add(lr.dtype)
        self.seen.append(hashlib.sha256(lr.numpy().tobytes() + hr.numpy().tobytes()).hexdigest()[:16])
        return torch.nn.functional.l1_loss(self.net(lr), lr)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        assert self.trainer.estimated_stepping_batches > 0  # builds and starts the loader early (#20550)
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(url: str, out: Path, steps: int, workers: int, ckpt_at: int | None = None, resume: Path | None = None, **kw) -> Probe:
    model = Probe()
    callbacks = list(kw.pop("callbacks", []))
    if ckpt_at is not None:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=out, filename="mid", every_n_train_steps=ckpt_at, save_top_k=-1))
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        max_epochs=10,  # with max_steps alone, estimated_stepping_batches would not build the loader (#20550 needs both)
        callbacks=callbacks,
        enable_checkpointing=ckpt_at is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=out,
        **{"logger": False, **kw},
    )
    trainer.fit(model, WdsrDataModule(url, num_workers=workers, **OPTIONS), ckpt_path=resume)
    return model


def scenario(url: str, out: Path, workers: int, straight_kw: dict | None = None, **kw) -> dict:
    """Straight (with ``straight_kw`` too), then checkpointed mid-epoch and resumed past the epoch's end: what each run saw."""
    probe = WdsrDataModule(url, num_workers=workers, **OPTIONS)
    probe.setup("fit")
    length = len(probe.train_dataloader())  # batches per rank per epoch
    mid, steps = length // 2 + 1, length + 2
    straight = fit(url, out / "straight", steps, workers, **kw, **(straight_kw or {}))
    first = fit(url, out / "first", mid, workers, ckpt_at=mid, **kw)
    resumed = fit(url, out / "resumed", steps, workers, resume=out / "first" / "mid.ckpt", **kw)
    ckpt = torch.load(out / "first" / "mid.ckpt", weights_only=True)
    return {
        "mid": mid,
        "straight": straight.seen,
        "first": first.seen,
        "resumed": resumed.seen,
        "dtypes": sorted(str(d) for d in straight.dtypes | resumed.dtypes),
        "ckpt_loader": ckpt["WdsrDataModule"]["loader"],
        "lightning_loader": ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"],
    }


def check(got: dict) -> None:
    mid = got["mid"]
    assert len(got["straight"]) == mid * 2 and got["first"] == got["straight"][:mid]
    assert got["resumed"] == got["straight"][mid:]
    assert got["dtypes"] == ["torch.float32"]  # on_after_batch_transfer
    assert got["ckpt_loader"]["epoch"] == 0 and got["ckpt_loader"]["batches"] == mid
    assert got["lightning_loader"] == [got["ckpt_loader"]]  # Lightning's own copy, the one #20550 drops


def test_lightning_resume_mid_epoch(photo_shards: Path, tmp_path: Path) -> None:
    ticks = count(1.0)  # a fake clock: one second per reading
    logger = pl.loggers.CSVLogger(tmp_path / "logs", name="", version="")
    got = scenario(
        str(photo_shards),
        tmp_path,
        2,
        {"callbacks": [WdsrStats(clock=lambda: next(ticks))], "logger": logger, "log_every_n_steps": 1},
    )
    check(got)
    # the straight run's log: each step reads the clock at batch start and end, so its step is 2 s, 1 s of it waiting
    rows = list(csv.DictReader(open(tmp_path / "logs" / "metrics.csv")))
    logged = [(float(r["data/wait"]), float(r["data/patches_per_s"])) for r in rows if r.get("data/wait")]
    assert logged and set(logged) == {(0.5, OPTIONS["batch_size"] / 2)}


@pytest.mark.parametrize("bad", [[], None, "x", {"loader": None}, {"loader": []}, {"loader": {}, "extra": 1}])
def test_a_state_that_is_not_the_modules_is_a_loader_state_error(photo_shards: Path, bad: object) -> None:
    """``load_state_dict([])`` was an AttributeError and ``{"loader": None}`` silently restarted the epoch."""
    dm = WdsrDataModule(str(photo_shards), num_workers=0, **OPTIONS)
    with pytest.raises(wdsr.LoaderStateError, match="WdsrDataModule state"):
        dm.load_state_dict(bad)  # type: ignore[arg-type]
    dm.load_state_dict({})  # a state taken before the loader was built: nothing to restore


@pytest.mark.slow
def test_lightning_ddp_resume_mid_epoch(photo_shards: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1"]
    cmd += [f"--master-port={free_port()}", "-m", "tests.test_integrations_lightning", str(tmp_path), str(photo_shards)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)  # reaped: run() waits
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for got in ranks:
        check(got)
    assert not set(ranks[0]["straight"]) & set(ranks[1]["straight"])  # each rank its own slice


if __name__ == "__main__":  # one rank of the DDP test
    out, url = Path(sys.argv[1]), sys.argv[2]
    got = scenario(url, out, workers=1, strategy="ddp", devices=2)
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(got))


def test_lightning_degrade_makes_lr_on_the_device(photo_shards: Path, tmp_path: Path) -> None:
    """``WdsrDataModule(url, degrade=cfg)``: the module gets float ``(lr, hr)`` made by ``wdsr.Degrader``
    in ``on_after_batch_transfer`` (here from the HR of a dataset with stored LR: it is not read)."""
    import wdsr

    shapes: list[tuple] = []

    class Shapes(Probe):
        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            shapes.append((tuple(batch[0].shape), tuple(batch[1].shape), batch[0].dtype))
            return super().training_step(batch, batch_idx)

    options = {**OPTIONS, "patch_size": 96, "degrade": wdsr.RealESRGANConfig(gt_size=96)}
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(Shapes(), WdsrDataModule(str(photo_shards), num_workers=0, **options))
    assert shapes == [((5, 3, 24, 24), (5, 3, 96, 96), torch.float32)] * 2
