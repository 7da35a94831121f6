"""wdsr's stages for ``webdataset`` pipelines: for users who keep their own ``wds.DataPipeline``.

    import webdataset as wds, wdsr.wds as sr
    pipeline = wds.DataPipeline(
        wds.SimpleShardList("s3://bucket/ds/shard-{000000..000127}.tar"),  # or wds.ResampledShards
        wds.split_by_node, wds.split_by_worker, wds.tarfile_to_samples(),
        wds.map(sr.decode_pair(scale=4)),                       # one decode per HR/LR pair
        sr.patches(k=16, patch_size=192, scale=4, seed=0),     # k aligned patches, dihedral augment
        wds.shuffle(1024),
        sr.batched(16),                                        # uint8 tensors lr [16,C,48,48], hr [16,C,192,192]
    )

``decode_pair`` reads our shards (``hr.png``/``hr.qoi`` + ``lr_x{s}.*``, digests checked against
``{key}.json``) and anyone's (``hr="jpg", lr="x4.jpg"``: any member names; the extension picks the
decoder: PNG, QOI, JPEG, WebP). Patches come from the same seeded generator as ``SRDataset``'s,
keyed by (seed, epoch, sample key, j), with the same alignment and flat-patch rejection.

What WebDataset's own splitting does not give (and ``SRDataset`` does): ``split_by_node`` and
``split_by_worker`` deal whole shards round-robin, so ranks get unequal numbers of batches when
shards do not divide evenly (DDP then hangs at the end of an epoch unless you cap the steps, e.g.
``.with_epoch(n)`` on ``wds.WebDataset``), every worker needs at least one shard, and a restart
begins the epoch again (no exact resume).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from shardmaker import format as fmt
from shardmaker.errors import brief
from wdsr.errors import SampleError
from wdsr.pipeline.batch import collate
from wdsr.pipeline.checks import Kind, Verify, check_digests, check_headers
from wdsr.pipeline.patches import Patch, PatchConfig, cut_patches
from wdsr.pipeline.whole import DecodedPair, decode_members


def _member(sample: dict[str, Any], want: str | None, prefix: str) -> str:
    if want is not None:
        if want not in sample:
            raise SampleError(str(sample.get("__url__", "?")), sample.get("__key__"), f"has no {want!r} member")
        return want
    found = sorted(k for k in sample if k.startswith(prefix))
    if not found:
        raise SampleError(str(sample.get("__url__", "?")), sample.get("__key__"), f"has no {prefix}* member")
    return found[0]


def decode_pair(
    scale: int,
    hr: str | None = None,
    lr: str | None = None,
    verify: bool = True,
    max_pixels: int = fmt.DEFAULT_MAX_PIXELS,
    channels: int | None = None,
    bit_depth: int | None = None,
) -> Callable[[dict[str, Any]], DecodedPair]:
    """A ``wds.map`` function: a sample dict -> the decoded, aligned pair.

    ``hr``/``lr`` name the members (default: ``hr.*`` and ``lr_x{scale}.*``, as in our shards). An
    HR whose size is not ``scale`` x LR is cropped to it when it is at most ``scale - 1`` pixels
    larger (a mod-crop), else refused. The headers are checked before anything is decoded (sizes,
    scale, ``max_pixels``, and the kind: ``channels`` 1|3 and ``bit_depth`` 8|16 where given, else
    the first sample each process decodes fixes them, so a batch never mixes kinds). With ``verify``
    and a ``json`` member carrying ``xxh3_64`` digests (our shards), the members are checked next.
    """
    if type(scale) is not int or scale < 1:
        raise ValueError(f"decode_pair: scale must be an int >= 1, got {brief(scale)}")
    if type(max_pixels) is not int or max_pixels < 1:
        raise ValueError(f"decode_pair: max_pixels must be an int >= 1, got {brief(max_pixels)}")
    for field, value, allowed in (("channels", channels, (1, 3)), ("bit_depth", bit_depth, (8, 16))):
        if value is not None and (type(value) is not int or value not in allowed):
            raise ValueError(f"decode_pair: {field} must be one of {allowed} or None, got {brief(value)}")
    kind = Kind("this pipeline", channels, bit_depth, channels is not None and bit_depth is not None)

    def fn(sample: dict[str, Any]) -> DecodedPair:
        url, key = str(sample.get("__url__", "?")), str(sample.get("__key__", "?"))
        names = (_member(sample, hr, "hr."), _member(sample, lr, f"lr_x{scale}."))
        hr_head, _ = check_headers(url, key, sample, names, scale, max_pixels, kind=kind)
        if verify and isinstance(sample.get("json"), (bytes, bytearray)):
            try:  # our shards' {key}.json: checked as SRDataset checks it, then the members against it
                header = fmt.SampleHeader.parse(sample["json"], url, key)
            except fmt.SampleHeaderError as exc:
                if not exc.foreign:
                    raise SampleError(url, key, exc.reason) from None
                header = None  # another tool's json: nothing of ours to check
            if header is not None:
                check_digests(url, key, sample, header.digests, names, Verify.XXH3)
        hr_img, lr_img = decode_members(url, key, sample, *names, scale, max_pixels)
        kind.fix(key, hr_head)
        return DecodedPair(url, key, 0, hr_img, lr_img, 0, 0)

    return fn


def patches(
    k: int,
    patch_size: int,
    scale: int,
    seed: int = 0,
    epoch: int | Callable[[], int] = 0,
    augment: bool = True,
    min_patch_std: float | None = None,
    max_tries: int = 10,
) -> Callable[[Iterable[DecodedPair]], Iterator[Patch]]:
    """A pipeline stage: each decoded pair -> its ``k`` aligned patches (patch j of a key in an
    epoch is the one ``SRDataset`` would cut). ``epoch`` may be a callable read at each pair."""
    spec = PatchConfig(scale, patch_size, augment, min_patch_std, max_tries)

    def stage(pairs: Iterable[DecodedPair]) -> Iterator[Patch]:
        for pair in pairs:
            e = epoch() if callable(epoch) else epoch
            got, _ = cut_patches(pair, spec, seed, e, 0, k)
            yield from got

    return stage


@dataclasses.dataclass(frozen=True)
class _Batched:
    batch_size: int
    keys: bool

    def __call__(self, items: Iterable[Patch]) -> Iterator[tuple[Any, ...]]:
        batch: list[Patch] = []
        for patch in items:
            batch.append(patch)
            if len(batch) == self.batch_size:
                yield collate(batch, self.keys)
                batch = []


def batched(batch_size: int, return_keys: bool = False) -> Callable[[Iterable[Patch]], Iterator[tuple[Any, ...]]]:
    """A pipeline stage: patches -> ``(lr [B,C,p,p], hr [B,C,sp,sp])`` uint8/uint16 tensors (and
    the keys); a last partial batch is dropped. Keep them integer until on the device
    (``wdsr.to_float``)."""
    return _Batched(batch_size, return_keys)
