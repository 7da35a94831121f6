"""The rules of ``wdsr-shards/1`` that every field is held to: names, sizes, member names, the
pairing rule, and the typed field checks that raise :class:`ManifestError` (where, field, reason)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from shardmaker.errors import ShardmakerError

FORMAT = "wdsr-shards/1"
MANIFEST = "manifest.json"


def pair_fits(hr_hw: tuple[int, int], lr_hw: tuple[int, int], scale: int) -> bool:
    """The format's pairing rule: HR sides are s x LR plus less than s (the mod-crop remainder)."""
    (h, w), (lh, lw) = hr_hw, lr_hw
    return 0 <= h - scale * lh < scale and 0 <= w - scale * lw < scale


class ManifestError(ShardmakerError, ValueError):
    """A manifest that is missing, unreadable or breaks the schema: ``where`` (URL or path),
    ``field`` (e.g. ``shards[3].offsets``) and ``reason``. Messages never quote the file's bytes."""

    def __init__(self, where: str, field: str | None = None, reason: str | None = None) -> None:
        if reason is None:
            msg = where
        else:
            msg = f"{where}: {field}: {reason}" if field else f"{where}: {reason}"
        super().__init__(msg)
        self.where, self.field, self.reason = where, field, reason

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.where, self.field, self.reason))


# ---- the schema ---------------------------------------------------------------------------------
CODECS = ("png", "qoi")
LR_METHODS = ("matlab", "matlab-uint8", "provided", "none")  # none: HR only (shardmaker build --hr-only)
MAX_SIDE = 1 << 20  # pixels per image side
MAX_SHARD_BYTES = 1 << 46
MAX_SAMPLES = 1 << 24  # per shard
MAX_MANIFEST_BYTES = 1 << 30
# A shard name: one path component, no "..", no leading dot; the shard URL is always dataset + "/" + name.
SHARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,250}\.tar")
# A key: the source's relative path without extension, dots replaced by "_": up to 32 "/"-separated
# segments of 1-255 characters, without dots, control characters (C0, DEL, C1) or backslashes, and
# without white space at either end of a segment (a name that looks like another, or that Windows
# or a shell changes). :func:`key_problem` says which rule a key breaks.
_SEGMENT = r"(?![\s])[^\x00-\x1f\x7f-\x9f\\/%s]{1,255}(?<![\s])"
KEY = re.compile(r"{s}(/{s}){{0,31}}".format(s=_SEGMENT % "."))
SHA256 = re.compile(r"[0-9a-f]{64}")
# Indexes of foreign shards (``shardmaker index``): keys as the other tool wrote them, dots allowed
# (no "." or ".." segment); member names like "hr.png", "jpg", "x4.jpg"; digests of the member data.
INDEX_KEY = re.compile(r"{s}(/{s}){{0,31}}".format(s=_SEGMENT % ""))
MAX_KEY_SEGMENTS = 32
MAX_SEGMENT_CHARS = 255
MEMBER_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}(\.[A-Za-z0-9_-]{1,32}){0,3}")
# "img": a side of an index of files that mixes formats (hr.img): each file is decoded by the format
# its bytes declare (headers.sniff), which the index checked against the file's extension
MIXED = "img"
MEMBER_CODECS = ("png", "qoi", "jpg", "jpeg", "webp", MIXED)
XXH3 = re.compile(r"[0-9a-f]{16}")


PROBE_BYTES = 1 << 20
BLOCK = 512  # tar block
JSON_MEMBER = "json"


TILED = "tiles"  # the extension of a tiled member (``{key}.hr.tiles``: shardmaker.format.tiles)


def hr_member(codec: str) -> str:
    """A sample's HR member suffix (``{key}.hr.png``)."""
    return f"hr.{codec}"


def lr_member(scale: int, codec: str) -> str:
    """A sample's LR member suffix for one scale (``{key}.lr_x4.png``)."""
    return f"lr_x{scale}.{codec}"


def sample_members(codec: str, scales: list[int] | tuple[int, ...]) -> list[str]:
    """Every member suffix of a sample, in the order the format writes them."""
    return [JSON_MEMBER, hr_member(codec)] + [lr_member(s, codec) for s in sorted(scales)]


# ---- clip samples (``shardmaker build --clips``): a segment of frames, per-frame members --------
MAX_SEGMENT = 1000  # frames per clip sample: frame member names hold 4 digits, and a sample stays a few GB at most
MAX_CLIP_FRAMES = 1 << 22  # frames of one clip (a video listing more is refused before anything is decoded)
CLIP_EXTS = ("png", "qoi", TILED)  # the extensions a clip sample's frame members may have
FRAME_MEMBER = re.compile(r"^(hr|lr_x(\d{1,2}))_f(\d{4})\.([a-z]{3,5})$")  # hr_f0003.png, lr_x4_f0003.png


def frame_member(side: str, t: int, ext: str) -> str:
    """A clip sample's member suffix for frame ``t`` of the segment: ``hr_f0003.png``, ``lr_x4_f0003.png``
    (``side`` is ``hr`` or ``lr_x{s}``)."""
    return f"{side}_f{t:04d}.{ext}"


def hr_frame(t: int, ext: str) -> str:
    """Frame ``t``'s HR member suffix (``hr_f0003.png``)."""
    return frame_member("hr", t, ext)


def lr_frame(scale: int, t: int, ext: str) -> str:
    """Frame ``t``'s x``scale`` LR member suffix (``lr_x4_f0003.png``)."""
    return frame_member(f"lr_x{scale}", t, ext)


def clip_members(frames: int, scales: list[int] | tuple[int, ...], ext: str) -> list[str]:
    """Every member suffix of a clip sample of ``frames`` frames, in the order the format writes them."""
    return [JSON_MEMBER] + [n for t in range(frames) for n in [hr_frame(t, ext)] + [lr_frame(s, t, ext) for s in sorted(scales)]]


def clip_ext(members: Any) -> str | None:
    """The extension of a clip sample's frame members (from its frame 0), or None: not a clip sample."""
    return next((e for e in CLIP_EXTS if hr_frame(0, e) in members), None)


def probe_of(head: bytes | bytearray, tail: bytes | bytearray) -> str:
    """The shard's probe: sha256 of its first and last MiB. It tells one build's shard from another's
    for ~1 ms per shard, where the full sha256 (``verify``) reads it all."""
    return hashlib.sha256(b"wdsr-probe/1\0" + bytes(head) + bytes(tail)).hexdigest()


def probe_file(f: Any, size: int) -> str:
    f.seek(0)
    head = f.read(min(PROBE_BYTES, size))
    f.seek(max(0, size - PROBE_BYTES))
    return probe_of(head, f.read(PROBE_BYTES))


def check_shard_name(name: Any, where: str = MANIFEST, field: str = "name") -> str:
    if not isinstance(name, str) or not SHARD_NAME.fullmatch(name) or ".." in name:
        raise ManifestError(
            where,
            field,
            "a shard name must be one file name like shard-000000.tar (letters, digits, '_', '-', '.'; no '/', no '..')",
        )
    return name


def shard_path(root: str, name: str) -> str:
    """Where shard ``name`` of the dataset at ``root`` is: inside it, whatever the manifest says."""
    return f"{root.rstrip('/')}/{check_shard_name(name)}"


def int_field(v: Any, where: str, field: str, lo: int, hi: int) -> int:
    if type(v) is not int:  # not bool, not float, not a string of digits
        raise ManifestError(where, field, f"must be an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ManifestError(where, field, f"must be in [{lo}, {hi}], got {v}")
    return v


def list_field(v: Any, where: str, field: str, n: int | None = None) -> list:
    if type(v) is not list:
        raise ManifestError(where, field, f"must be a list, got {type(v).__name__}")
    if n is not None and len(v) != n:
        raise ManifestError(where, field, f"must have {n} entries (one per sample), has {len(v)}")
    return v


def str_field(v: Any, where: str, field: str) -> str:
    if not isinstance(v, str):
        raise ManifestError(where, field, f"must be a string, got {type(v).__name__}")
    return v


def key_problem(key: Any, dots: bool = False) -> str | None:
    """Why ``key`` is not a key of the format (None: it is one); ``dots``: a foreign shard's key
    (``shardmaker index``), where dots are allowed but not a ``.`` or ``..`` segment."""
    if isinstance(key, str) and (INDEX_KEY if dots else KEY).fullmatch(key) and not (dots and _dot_segment(key)):
        return None  # the fast path: every key of a good manifest
    if not isinstance(key, str):
        return f"must be a string, got {type(key).__name__}"
    parts = key.split("/")
    if len(parts) > MAX_KEY_SEGMENTS:
        return f"has {len(parts)} '/'-separated segments; at most {MAX_KEY_SEGMENTS}"
    for i, seg in enumerate(parts):
        if not seg:
            return "has an empty segment (a leading, trailing or double '/')"
        if len(seg) > MAX_SEGMENT_CHARS:
            return f"has a segment longer than {MAX_SEGMENT_CHARS} characters (segment {i + 1}: {len(seg)})"
        if re.search(r"[\x00-\x1f\x7f-\x9f]", seg):
            return "has a control character"
        if "\\" in seg:
            return "has a backslash (keys separate folders with '/')"
        if seg != seg.strip():
            return f"segment {i + 1} starts or ends with white space"
        if dots and seg in (".", ".."):
            return "has a '.' or '..' segment"
        if not dots and "." in seg:
            return "has a dot (our keys replace every '.' with '_')"
    return "is not a key"  # not reached for a string: every rule above is named


def _dot_segment(key: str) -> bool:
    return "." in key and any(p in (".", "..") for p in key.split("/"))


def codec_of(member: str) -> str:
    """The codec of a member name: its last part (``x4.jpg`` -> ``jpg``)."""
    return member.rsplit(".", 1)[-1].lower()
