"""Run under torchrun: stream one epoch with a collective per step, report what this rank saw."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist

import wdsr


def main() -> int:
    url, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert int(os.environ["RANK"]) == rank
    ds = wdsr.SRDataset(
        url,
        scale=4,
        patch_size=48,
        patches_per_image=3,
        batch_size=2,
        shuffle_buffer=8,
        seed=11,
        return_keys=True,
        on_error=os.environ.get("WDSR_ON_ERROR", "fail"),
        decoded_cache=os.environ.get("WDSR_DECODED_CACHE"),
    )
    loader = wdsr.make_loader(ds, num_workers=workers)
    report = {"rank": rank, "world": world, "len": len(loader), "epochs": []}
    for epoch in range(2):
        ds.set_epoch(epoch)
        steps, keys, digests = 0, [], []
        before = ds.stats.totals()
        for lr, hr, k in loader:
            t = torch.tensor([float(lr.float().mean())])
            dist.all_reduce(t)  # like DDP's gradient all-reduce: a rank with fewer batches would hang here
            steps += 1
            keys += k
            digests.append(hashlib.sha256(lr.numpy().tobytes() + hr.numpy().tobytes()).hexdigest()[:16])
        after = ds.stats.totals()
        delta = {n: after[n] - before[n] for n in ("samples", "bytes_read", "decoded_hits", "decoded_stores")}
        report["epochs"].append({"steps": steps, "keys": keys, "digests": digests, "stats": delta})
    report["stats"] = ds.stats.totals()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
