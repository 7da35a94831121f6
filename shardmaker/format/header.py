"""The per-sample header ``{key}.json``: its fields (:class:`SampleHeader`), the one parser
(:meth:`SampleHeader.parse`: bytes -> checked header), the one encoder (:meth:`SampleHeader.encode`:
the exact bytes the build writes); its digests and the one digest check are :mod:`.digests`.

Every reader (``shardmaker verify``/``cat``/``build``'s resume, ``wdsr``'s stream and ``wdsr.wds``)
and every writer (image and clip samples) goes through here. A header that breaks a rule is a
:class:`SampleHeaderError` naming the shard and key; messages never quote its bytes.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from shardmaker.errors import brief
from shardmaker.format.digests import Digests, SampleHeaderError
from shardmaker.format.schema import LR_METHODS, MAX_CLIP_FRAMES, MAX_SEGMENT, MAX_SIDE
from shardmaker.format.tiles import MAX_TILE, MIN_TILE

MAX_HEADER_BYTES = 1 << 22  # a 1000-frame segment's json is under 1 MB; anything larger is refused unparsed
MAX_TEXT = 4096  # characters of a source path, clip key or frame name
MAX_SCALE = 16
_REGION = ("y", "x", "h", "w")
_CLIP = ("clip", "clip_frames", "first_frame", "frames", "owned", "frame_names")
_FIELDS = frozenset(
    ("key", "source", "hr_size", "scales", "bit_depth", "channels", "lr_method", "lr_sizes", "hr_crop", "sha256", "xxh3_64")
    + ("tiles", "lr_sources", "region", "image_size")
    + _CLIP
)


@dataclasses.dataclass(frozen=True)
class ClipSpan:
    """Where a clip sample's segment sits in its clip: frames ``first_frame ..`` of ``clip_frames``,
    owning the window starts ``owned`` ``[a, b)`` (clip frame indices); its frames' source names."""

    clip: str  # the clip's key
    clip_frames: int
    first_frame: int
    frames: int
    owned: tuple[int, int]
    frame_names: tuple[str, ...]

    def __post_init__(self) -> None:
        if type(self.clip) is not str or not 1 <= len(self.clip) <= MAX_TEXT:
            raise ValueError(f"clip must be the clip's key, got {brief(self.clip)}")
        _int("clip_frames", self.clip_frames, 1, MAX_CLIP_FRAMES)
        _int("frames", self.frames, 1, min(MAX_SEGMENT, self.clip_frames))
        _int("first_frame", self.first_frame, 0, self.clip_frames - self.frames)
        a, b = self.owned
        if not self.first_frame <= a < b <= self.first_frame + self.frames:
            raise ValueError(
                f"owned starts [{a}, {b}) are not inside its frames [{self.first_frame}, {self.first_frame + self.frames})"
            )
        if len(self.frame_names) != self.frames or not all(type(n) is str and len(n) <= MAX_TEXT for n in self.frame_names):
            raise ValueError(f"frame_names must be {self.frames} names, got {brief(self.frame_names)}")


@dataclasses.dataclass(frozen=True)
class SampleHeader:
    """The fields of ``{key}.json``. Sizes are ``(w, h)``; ``lr_sizes`` maps each scale to its LR
    size (``hr_crop``, recorded beside it, is always ``s x`` that); ``region`` ``(y, x, h, w)`` and
    ``image_size`` for a region of a larger image; ``tiles`` the HR tile side of a tiled sample;
    ``lr_sources`` the LR files' relative paths (provided LR); ``clip`` for a clip segment."""

    key: str
    source: str
    hr_size: tuple[int, int]
    scales: tuple[int, ...]
    bit_depth: int
    channels: int
    lr_method: str
    lr_sizes: dict[int, tuple[int, int]]
    digests: Digests = dataclasses.field(default_factory=lambda: Digests({}))  # the writer's: made from the members
    tiles: int | None = None
    lr_sources: dict[int, str] | None = None
    region: tuple[int, int, int, int] | None = None
    image_size: tuple[int, int] | None = None
    clip: ClipSpan | None = None

    def __post_init__(self) -> None:
        for name, v, least in (("key", self.key, 1), ("source", self.source, 0)):  # source "": frames right in the clips folder
            if type(v) is not str or not least <= len(v) <= MAX_TEXT:
                raise ValueError(f"{name} must be a path of {least} to {MAX_TEXT} characters, got {brief(v)}")
        _size("hr_size", self.hr_size)
        if list(self.scales) != sorted(set(self.scales)) or any(
            type(s) is not int or not 2 <= s <= MAX_SCALE for s in self.scales
        ):
            raise ValueError(f"scales must be increasing integers in [2, {MAX_SCALE}], got {brief(self.scales)}")
        if self.bit_depth not in (8, 16) or type(self.bit_depth) is not int:
            raise ValueError(f"bit_depth must be 8 or 16, got {brief(self.bit_depth)}")
        if self.channels not in (1, 3) or type(self.channels) is not int:
            raise ValueError(f"channels must be 1 or 3, got {brief(self.channels)}")
        if self.lr_method not in LR_METHODS:
            raise ValueError(f"lr_method must be one of {', '.join(LR_METHODS)}, got {brief(self.lr_method)}")
        if (self.lr_method == "none") != (not self.scales):
            raise ValueError("scales must be empty exactly when lr_method is none (HR only)")
        if sorted(self.lr_sizes) != list(self.scales):
            raise ValueError(f"lr_sizes must have one size per scale {list(self.scales)}, got {brief(self.lr_sizes)}")
        for s, size in self.lr_sizes.items():
            _size(f"lr_sizes.{s}", size)
        if self.tiles is not None and (
            _int("tiles", self.tiles, MIN_TILE, MAX_TILE) and any(self.tiles % s for s in self.scales)
        ):
            raise ValueError(f"tiles must be a multiple of every scale {list(self.scales)}, got {self.tiles}")
        if self.lr_sources is not None and (
            sorted(self.lr_sources) != list(self.scales)
            or not all(type(v) is str and len(v) <= MAX_TEXT for v in self.lr_sources.values())
        ):
            raise ValueError(f"lr_sources must name one LR source per scale {list(self.scales)}")
        if (self.region is None) != (self.image_size is None):
            raise ValueError("region and image_size come together (a region of a larger image)")
        if self.region is not None and self.image_size is not None:
            _size("image_size", self.image_size)
            for side, at in zip(_REGION, self.region, strict=True):
                _int(f"region.{side}", at, 0, MAX_SIDE)

    @classmethod
    def parse(cls, data: Any, shard: str, key: str) -> SampleHeader:
        """Bytes of ``{key}.json`` -> the checked header (:func:`parse_header`)."""
        return parse_header(data, shard, key)

    def encode(self) -> bytes:
        """The bytes of ``{key}.json`` (:func:`encode_header`)."""
        return encode_header(self)

    @property
    def hr_crop(self) -> dict[int, tuple[int, int]]:
        """The HR size each LR pairs with: ``s x`` its LR size (the mod-crop of ``hr_size``)."""
        return {s: (s * w, s * h) for s, (w, h) in self.lr_sizes.items()}

    def to_json(self) -> dict[str, Any]:
        """The header as the JSON object ``{key}.json`` holds."""
        d: dict[str, Any] = {
            "key": self.key,
            "source": self.source,
            "hr_size": list(self.hr_size),
            "scales": list(self.scales),
            "bit_depth": self.bit_depth,
            "channels": self.channels,
            "lr_method": self.lr_method,
            "lr_sizes": {str(s): list(v) for s, v in self.lr_sizes.items()},
            "hr_crop": {str(s): list(v) for s, v in self.hr_crop.items()},
            "sha256": dict(self.digests.sha256),
        }
        if self.digests.xxh3_64 is not None:
            d["xxh3_64"] = dict(self.digests.xxh3_64)
        if self.region is not None and self.image_size is not None:
            d["region"], d["image_size"] = dict(zip(_REGION, self.region, strict=True)), list(self.image_size)
        if self.tiles is not None:
            d["tiles"] = self.tiles
        if self.lr_sources is not None:
            d["lr_sources"] = {str(s): v for s, v in self.lr_sources.items()}
        if self.clip is not None:
            d |= {f: getattr(self.clip, f) for f in _CLIP}
            d["owned"], d["frame_names"] = list(self.clip.owned), list(self.clip.frame_names)
        return d


def encode_header(header: SampleHeader) -> bytes:
    """The bytes of ``{key}.json``: sorted keys, no spaces (deterministic: shards are byte-identical)."""
    return json.dumps(header.to_json(), sort_keys=True, separators=(",", ":")).encode()


def parse_header(data: Any, shard: str, key: str) -> SampleHeader:
    """Bytes of ``{key}.json`` -> the checked header: a JSON object of known fields, each of its type
    and in its range, describing ``key``; else a :class:`SampleHeaderError` naming shard and key."""
    d = _json_object(data, shard, key)
    if "sha256" not in d and "xxh3_64" not in d:
        raise SampleHeaderError(shard, key, f"{key}.json has no member digests (not a sample header)", foreign=True)
    try:
        if unknown := sorted(set(d) - _FIELDS):
            raise ValueError(f"{brief(unknown[0])} is not a field of the sample header")
        for name in ("key", "source", "hr_size", "scales", "bit_depth", "channels", "lr_method", "lr_sizes", "hr_crop", "sha256"):
            if name not in d:
                raise ValueError(f"{name} is missing")
        header = SampleHeader(
            key=d["key"],
            source=d["source"],
            hr_size=_pair("hr_size", d["hr_size"]),
            scales=tuple(_list("scales", d["scales"])),
            bit_depth=d["bit_depth"],
            channels=d["channels"],
            lr_method=d["lr_method"],
            lr_sizes={_scale("lr_sizes", s): _pair(f"lr_sizes.{s}", v) for s, v in _dict("lr_sizes", d["lr_sizes"]).items()},
            digests=Digests(d["sha256"], d.get("xxh3_64")),
            tiles=d.get("tiles"),
            lr_sources=None
            if "lr_sources" not in d
            else {_scale("lr_sources", s): v for s, v in _dict("lr_sources", d["lr_sources"]).items()},
            region=_region(d),
            image_size=None if "image_size" not in d else _pair("image_size", d["image_size"]),
            clip=_clip(d),
        )
        if header.key != key:
            raise ValueError(f"key is {brief(header.key)}, not this sample's")
        crop = _dict("hr_crop", d["hr_crop"])
        if crop != {str(s): list(v) for s, v in header.hr_crop.items()}:
            raise ValueError(f"hr_crop must be s x lr_sizes for each scale, got {brief(crop)}")
    except (ValueError, TypeError) as exc:
        raise SampleHeaderError(shard, key, f"{key}.json: {exc}") from None
    return header


def parse_digests(data: Any, shard: str, key: str) -> Digests:
    """The digests of a JSON object that records only them (a clip frame's view of its segment's header)."""
    d = _json_object(data, shard, key)
    try:
        return Digests(d.get("sha256"), d.get("xxh3_64"))  # type: ignore[arg-type]
    except ValueError as exc:
        raise SampleHeaderError(shard, key, f"{key}.json: {exc}") from None


def _json_object(data: Any, shard: str, key: str) -> dict[str, Any]:
    if len(data) > MAX_HEADER_BYTES:
        raise SampleHeaderError(shard, key, f"{key}.json of {len(data)} bytes: over {MAX_HEADER_BYTES}")
    try:
        d = json.loads(bytes(data))
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise SampleHeaderError(shard, key, f"{key}.json is not valid JSON", foreign=True) from None
    if type(d) is not dict:
        raise SampleHeaderError(shard, key, f"{key}.json is not a JSON object", foreign=True)
    return d


def _int(name: str, v: Any, lo: int, hi: int) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {brief(v)}")
    return v


def _size(name: str, v: tuple[int, int]) -> None:
    for i, side in enumerate(v):
        _int(f"{name}[{i}]", side, 1, MAX_SIDE)


def _list(name: str, v: Any, n: int | None = None) -> list[Any]:
    if type(v) is not list or (n is not None and len(v) != n) or len(v) > MAX_SEGMENT * (MAX_SCALE + 1):
        raise ValueError(f"{name} must be a list{'' if n is None else f' of {n} items'}, got {brief(v)}")
    return v


def _pair(name: str, v: Any) -> tuple[int, int]:
    w, h = _list(name, v, 2)
    return _int(f"{name}[0]", w, 1, MAX_SIDE), _int(f"{name}[1]", h, 1, MAX_SIDE)


def _dict(name: str, v: Any) -> dict[str, Any]:
    if type(v) is not dict or len(v) > MAX_SCALE:
        raise ValueError(f"{name} must be an object with one entry per scale, got {brief(v)}")
    return v


def _scale(name: str, s: str) -> int:
    if not (s.isascii() and s.isdigit() and str(int(s)) == s):
        raise ValueError(f"{name} has the key {brief(s)}, not a scale")
    return int(s)


def _region(d: dict[str, Any]) -> tuple[int, int, int, int] | None:
    if "region" not in d:
        return None
    r = d["region"]
    if type(r) is not dict or sorted(r) != sorted(_REGION):
        raise ValueError(f"region must be {{y, x, h, w}}, got {brief(r)}")
    return tuple(_int(f"region.{n}", r[n], 0, MAX_SIDE) for n in _REGION)  # type: ignore[return-value]


def _clip(d: dict[str, Any]) -> ClipSpan | None:
    present = [f for f in _CLIP if f in d]
    if not present:
        return None
    if len(present) != len(_CLIP):
        raise ValueError(
            f"a clip sample's header has all of {', '.join(_CLIP)}; {sorted(set(_CLIP) - set(present))[0]} is missing"
        )
    owned = _list("owned", d["owned"], 2)
    if not all(type(o) is int for o in owned):
        raise ValueError(f"owned must be [first, stop) window starts, got {brief(owned)}")
    names = _list("frame_names", d["frame_names"])
    return ClipSpan(d["clip"], d["clip_frames"], d["first_frame"], d["frames"], (owned[0], owned[1]), tuple(names))
