"""What a kind of sample declares for the decoder's table (``wdsr.pipeline.kinds``): how a sample is
stored (:class:`SampleKind`: whole image, tiled image, clip segment) and where its LR comes from
(:class:`LrSource`: stored, made per patch, made on the device), with the settings every kind is
decoded under (:class:`DecodeSpec`).

Whatever its kind, a decoded sample is a ``wdsr.pipeline.patches.Pair``: it cuts its patches ``j``
at the positions the draws give them. A new kind (3D volumes, say) is a module that declares one
:class:`SampleKind` and a row in ``kinds.SAMPLE_KINDS``; nothing else changes.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable
from typing import Any

from shardmaker import format as fmt
from shardmaker.errors import brief
from shardmaker.format import Manifest
from wdsr.pipeline.checks import Kind, Verify
from wdsr.pipeline.read import RawSample
from wdsr.store import urls


class LrMode(str, enum.Enum):
    """Where a pair's LR comes from: the dataset's stored LR, or made from its HR."""

    STORED = "stored"  # the dataset's LR images (lr="stored", the default)
    BICUBIC = "bicubic"  # made per patch, MATLAB-exactly (--lr-method matlab): lr="bicubic"
    BICUBIC_UINT8 = "bicubic-uint8"  # made per patch as --lr-method matlab-uint8 makes it: lr="bicubic-uint8"
    DEGRADE = "degrade"  # made on the device from HR patches and their parameters: degrade=wdsr.RealESRGANConfig()

    @classmethod
    def of(cls, value: Any) -> LrMode:
        """What a user's ``lr=`` names (a string or an LrMode); ``degrade=`` is how LR is made on the device."""
        choices = [m.value for m in cls if m is not cls.DEGRADE]
        if isinstance(value, str) and value in choices:
            return cls(value)
        hint = " (degrade=wdsr.RealESRGANConfig() makes LR on the device)" if value == cls.DEGRADE.value else ""
        raise ValueError(f"lr must be one of {', '.join(choices)}, got {brief(value)}{hint}")

    @property
    def made(self) -> bool:
        """LR made from HR: the sample is read and decoded without its stored LR."""
        return self is not LrMode.STORED


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    """How a source's samples are decoded: the members (HR, LR; LR ``""`` when it is made), the scale,
    the checks before any decode (``verify``, ``max_pixels``, the dataset's ``kind``), and what the
    kinds that need them take (``clip``: a ``wdsr.ClipConfig``; ``degrade``: a wdsr.degrade config)."""

    names: tuple[str, str]
    scale: int
    verify: Verify = Verify.XXH3
    max_pixels: int = fmt.DEFAULT_MAX_PIXELS
    kind: Kind | None = None
    clip: Any = None
    lr: LrMode = LrMode.STORED
    degrade: Any = None


@dataclasses.dataclass(frozen=True)
class Hr:
    """A sample's HR image alone (an array, or a lazily decoded tiled image), checked, for LR made from it."""

    image: Any
    decode_ns: int
    verify_ns: int


@dataclasses.dataclass(frozen=True)
class SampleKind:
    """How one kind of sample is stored and decoded: a row of the decoder's table.

    ``claims(raw)``: a sample is of this kind (read from its members); ``holds(m)``: a dataset may hold
    samples of this kind; ``members(m, scale, lr)``: the member names one is read with; ``pair``: the
    sample decoded with its stored LR; ``hr``: its HR alone, for LR made from it (None: not there yet);
    ``options(folder, clip)``: what a dataset of this kind asks of the options (a ValueError naming the
    folder); ``what``, ``plural``: how messages name its datasets and samples. The LR modes a kind does
    not serve are refused before any read."""

    name: str
    what: str
    plural: str
    claims: Callable[[RawSample], bool]
    holds: Callable[[Manifest], bool]
    members: Callable[[Manifest, int, LrMode], frozenset[str]]
    pair: Callable[[RawSample, dict[str, Any], DecodeSpec], Any]
    options: Callable[[str, Any], None]
    hr: Callable[[RawSample, dict[str, Any], DecodeSpec], Hr] | None = None

    def serves(self, lr: LrMode) -> bool:
        return lr is LrMode.STORED or self.hr is not None


@dataclasses.dataclass(frozen=True)
class LrSource:
    """Where a pair's LR comes from: a row of the decoder's table.

    ``modes``: the LR modes it serves; ``make(raw, hr, spec)``: the pair made from a checked HR (None for
    the stored LR, which each sample kind decodes itself); ``check(folder, m, scale)``: what a dataset
    must be for it, from its manifest (a ValueError naming the folder); ``cacheable``: its pairs may be
    kept in the node-wide decoded cache; ``what``: how messages name it."""

    modes: tuple[LrMode, ...]
    make: Callable[[RawSample, Hr, DecodeSpec], Any] | None
    check: Callable[[str, Manifest, int], None]
    cacheable: bool

    def what(self, mode: LrMode) -> str:
        return "degrade=" if mode is LrMode.DEGRADE else f"lr='{mode.value}'"


def is_clip_dataset(m: Manifest) -> bool:
    """Built with ``shardmaker build --clips``: its samples are clip segments."""
    return m.members is None and isinstance(m.build.get("clips"), dict)


def first_folder_clips(url: str) -> tuple[str, bool]:
    """``url``'s (first) dataset folder, and whether it holds clips; its manifest's own errors raise."""
    folder = (urls.dataset_folders(url) or [urls.resolve(url).folder])[0]
    return folder, is_clip_dataset(fmt.load(folder, compact=True))


def tile_reads(images: Iterable[Any]) -> dict[str, int]:
    """Bytes read for the tiles of ``images`` (and ns waited for them) since the last call, as the
    stream's stats count them (``bytes_read``, ``read_ns``); images that are not tiled read nothing."""
    got = [take() for take in (getattr(img, "take_reads", None) for img in images) if take is not None]
    return {"bytes_read": sum(b for b, _ in got), "read_ns": sum(ns for _, ns in got)} if got else {}
