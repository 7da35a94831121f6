"""Video clips as samples (``shardmaker build CLIPS OUT --clips``): folders of frames (REDS, Vimeo-90K,
SurgiSR4K-style names) and video files decoded frame-exactly through PyAV, cut into segments of
consecutive frames, each stored as one sample of per-frame members.

A clip folder is any folder that holds image files directly; its frames are sorted naturally
(``frame2`` before ``frame10``), and where every name carries a number the numbers must run without
a gap (a missing frame is named). A video file (``.mp4 .mkv .mov .avi .webm``) is a clip of its own.

Segments: a clip of at most ``segment`` frames is one sample. A longer clip is cut into segments that
overlap by ``max_span - 1`` frames, so every window of up to ``max_span`` frames lies in one segment;
the window starts are partitioned among the segments (each segment *owns* a range of starts, recorded
in its ``{key}.json``), so each window belongs to exactly one segment and none is counted twice. The
owned ranges are as even as the clip allows (they differ by at most one start for windows of
``max_span`` frames; the last segment also owns the clip's tail, the starts of shorter windows only).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import xxhash
from fsspec.core import url_to_fs

from shardmaker import storage
from shardmaker.builder.sources import Collector, Pair, Skipped, header_size, make_key, open_root, scale_of, stamp_of
from shardmaker.errors import InputError, OnError
from shardmaker.format import tario
from shardmaker.format.manifest import pair_fits
from shardmaker.format.schema import TILED
from shardmaker.imaging import codecs
from shardmaker.imaging.codecs import Codec, ImageDataError

VIDEO_EXTENSIONS = (".mp4", ".mkv", ".mov", ".avi", ".webm")
DEFAULT_SEGMENT, DEFAULT_MAX_SPAN = 100, 16
MAX_SEGMENT = 1000  # frames per sample: member names hold 4 digits, and a sample stays a few GB at most
MAX_CLIP_FRAMES = 1 << 22  # a video listing more is refused before anything is decoded


@dataclasses.dataclass(frozen=True)
class ClipOptions:
    """How clips are cut into samples: at most ``segment`` frames each, windows of up to
    ``max_span`` frames (``(T - 1) * interval + 1``) always inside one segment."""

    segment: int = DEFAULT_SEGMENT
    max_span: int = DEFAULT_MAX_SPAN

    def __post_init__(self) -> None:
        if not (type(self.segment) is int and type(self.max_span) is int and 1 <= self.max_span <= self.segment <= MAX_SEGMENT):
            raise ValueError(
                f"clips need 1 <= max_span <= segment <= {MAX_SEGMENT} frames, got segment={self.segment!r}, "
                f"max_span={self.max_span!r}"
            )


@dataclasses.dataclass(frozen=True)
class ClipPart:
    """One segment of a clip: its frames' sources and the window starts it owns (clip frame indices)."""

    clip: str  # the clip's key
    first: int  # the clip index of the segment's first frame
    count: int
    clip_frames: int
    owned: tuple[int, int]  # window starts [a, b) this segment owns
    hr_frames: tuple[str, ...]  # frame URLs; () for a video (Pair.hr is the video)
    lr_frames: tuple[tuple[int, tuple[str, ...]], ...] = ()  # per provided LR scale: frame URLs; () for videos
    names: tuple[str, ...] = ()  # the frames' source names (a video's: frame numbers)


def natural_key(name: str) -> list[Any]:
    """``frame2`` before ``frame10``: digit runs compare as numbers."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t.lower()) for t in re.split(r"(\d+)", name) if t]


def plan_segments(frames: int, opts: ClipOptions) -> list[tuple[int, int, int, int]]:
    """``(first, count, owned_start, owned_stop)`` of each segment of a clip of ``frames`` frames."""
    if frames <= opts.segment:
        return [(0, frames, 0, frames)]
    overlap = opts.max_span - 1
    full = frames - overlap  # starts of windows of max_span frames
    stride = opts.segment - overlap
    n = -(-full // stride)
    sizes = [full // n + (i < full % n) for i in range(n)]
    out, a = [], 0
    for i, p in enumerate(sizes):
        last = i == n - 1
        stop = frames if last else a + p
        out.append((a, (frames if last else a + p + overlap) - a, a, stop))
        a += p
    return out


def _frame_number(stem: str) -> int | None:
    m = re.search(r"(\d+)(?!.*\d)", stem)
    return int(m.group(1)) if m else None


def _gap(names: Sequence[str]) -> str | None:
    """Where the frames' numbers jump (a missing frame), when every name has a number."""
    nums = [_frame_number(posixpath.splitext(posixpath.basename(n))[0]) for n in names]
    if any(x is None for x in nums):
        return None
    for a, b, na, nb in zip(nums, nums[1:], names, names[1:], strict=False):
        assert a is not None and b is not None
        if b != a + 1:
            return f"frame numbers jump from {posixpath.basename(na)} to {posixpath.basename(nb)} (a missing or extra frame?)"
    return None


@dataclasses.dataclass
class _Clip:
    rel: str  # relative path: a folder, or a video file
    url: str
    frames: list[str]  # frame paths (folders) or [] (video)
    size: tuple[int, int]
    count: int
    stamps: list[str]


def _list(fs: Any, root: str, out: Collector) -> tuple[dict[str, list[tuple[str, str]]], dict[str, str], list[str]]:
    """Frame folders (relative folder -> [(path, stamp)] of its images), videos (relative path -> stamp)
    and the files that are neither (listed, not errors)."""
    folders: dict[str, list[tuple[str, str]]] = {}
    videos: dict[str, str] = {}
    ignored: list[str] = []
    for path, info in sorted(fs.find(root, detail=True).items()):
        base = posixpath.basename(path)
        rel = posixpath.relpath(path, root)
        if base.startswith(".") or any(part.startswith(".") for part in rel.split("/")[:-1]):
            continue
        if info.get("type") != "file":
            continue
        low = base.lower()
        if low.endswith(codecs.SOURCE_EXTENSIONS):
            folders.setdefault(posixpath.dirname(rel), []).append((path, stamp_of(info)))
        elif low.endswith(VIDEO_EXTENSIONS):
            videos[rel] = stamp_of(info)
        else:
            ignored.append(storage.url_of(fs, path))
    return folders, videos, ignored


def _folder_clip(fs: Any, rel: str, files: list[tuple[str, str]], out: Collector) -> _Clip | None:
    files = sorted(files, key=lambda ps: natural_key(posixpath.basename(ps[0])))
    paths = [p for p, _ in files]
    url = storage.url_of(fs, posixpath.dirname(paths[0]))
    if (gap := _gap(paths)) is not None:
        out.problem(url, gap)
        return None
    size = None
    for p in paths:
        try:
            got = header_size(fs, p, posixpath.splitext(p)[1])
        except InputError as exc:
            out.problem(url, f"frame {posixpath.basename(p)}: {exc.reason}")
            return None
        if size is None:
            size = got
        elif got != size:
            out.problem(
                url,
                f"frame {posixpath.basename(p)} is {got[0]}x{got[1]}, frame {posixpath.basename(paths[0])} {size[0]}x{size[1]}",
            )
            return None
    assert size is not None
    return _Clip(rel, url, paths, size, len(paths), [s for _, s in files])


def video_info(url: str, storage_options: dict[str, Any] | None = None) -> tuple[tuple[int, int], list[int]]:
    """``((w, h), presentation timestamps of every frame in order)`` of a video's first video stream,
    from its packets alone (nothing is decoded)."""
    import av

    try:
        with _open_video(url, storage_options) as c:
            if not c.streams.video:
                raise InputError(url, "has no video stream")
            s = c.streams.video[0]
            pts: list[int] = []
            for p in c.demux(s):
                if p.pts is not None:
                    pts.append(int(p.pts))
                    if len(pts) > MAX_CLIP_FRAMES:
                        raise InputError(url, f"has over {MAX_CLIP_FRAMES} frames")
            w, h = int(s.codec_context.width), int(s.codec_context.height)
    except av.FFmpegError as exc:
        raise InputError(url, f"not a readable video ({exc})") from None
    if not pts or w < 1 or h < 1:
        raise InputError(url, "has no frames")
    return (w, h), sorted(pts)


class _open_video:  # noqa: N801 - a context manager used like open()
    """A video container on a local path or an fsspec URL (a regular file: never blocks)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None) -> None:
        import av

        fs, path = url_to_fs(url, **(storage_options or {}))
        self._f = storage.open_input(fs, path)
        try:
            self._c = av.open(self._f, "r")
        except BaseException:
            self._f.close()
            raise

    def __enter__(self) -> Any:
        return self._c

    def __exit__(self, *exc: object) -> None:
        self._c.close()
        self._f.close()


def video_frames(url: str, first: int, count: int, storage_options: dict[str, Any] | None = None) -> Iterator[np.ndarray]:
    """Frames ``first .. first + count - 1`` (in presentation order) of a video, frame-exactly: seek
    to the keyframe before the first, decode forward and keep frames by their timestamps. RGB (or
    grey) uint8, or uint16 for sources of more than 8 bits."""
    import av

    _, pts = video_info(url, storage_options)
    want = pts[first : first + count]
    if len(want) != count:
        raise InputError(url, f"has {len(pts)} frames, not {first + count}")
    try:
        with _open_video(url, storage_options) as c:
            s = c.streams.video[0]
            c.seek(want[0], stream=s, backward=True, any_frame=False)
            got = 0
            for frame in c.decode(s):
                if frame.pts is None or frame.pts < want[0]:
                    continue
                if frame.pts != want[got]:
                    raise InputError(url, f"frame {first + got}: decoded timestamp {frame.pts}, expected {want[got]}")
                yield _pixels(frame)
                got += 1
                if got == count:
                    return
    except av.FFmpegError as exc:
        raise InputError(url, f"decoding failed ({exc})") from None
    raise InputError(url, f"ended after {got} of frames {first}..{first + count - 1}")


def _pixels(frame: Any) -> np.ndarray:
    fmt = frame.format
    deep = max(c.bits for c in fmt.components) > 8
    grey = fmt.name.startswith("gray")
    out = frame.to_ndarray(format=("gray16le" if deep else "gray") if grey else ("rgb48le" if deep else "rgb24"))
    return np.ascontiguousarray(out)


def _video_clip(fs: Any, root: str, rel: str, stamp: str, out: Collector, options: dict[str, Any] | None) -> _Clip | None:
    url = storage.url_of(fs, posixpath.join(root, rel))
    try:
        size, pts = video_info(url, options)
    except InputError as exc:
        out.problem(exc.path, exc.reason)
        return None
    return _Clip(rel, url, [], size, len(pts), [stamp])


def _clip_key(rel: str, video: bool) -> str:
    """A video's relative path without extension, a folder's relative path (``.`` as ``_``);
    frames directly in the clips folder: ``clip``."""
    return make_key(rel) if video else rel.replace(".", "_") or "clip"


def scan_clips(
    hr_url: str,
    lr_urls: Sequence[str] = (),
    opts: ClipOptions = ClipOptions(),
    mod_crop: bool = True,
    on_error: OnError = OnError.FAIL,
    storage_options: dict[str, Any] | None = None,
) -> tuple[list[Pair], list[Skipped], list[str]]:
    """One pair per clip segment under ``hr_url`` (sorted by key), the clips skipped (``skip``) and
    the files that are neither frames nor videos. LR clips (``--lr``) sit at the same relative
    paths under each LR folder, with the same frame names (or as videos of the same name), one
    scale per folder, every frame checked HR = s x LR from its header."""
    fs, root = open_root(hr_url, "clips folder", storage_options)
    out = Collector(OnError(on_error))
    folders, videos, ignored = _list(fs, root, out)
    clips: list[_Clip] = []
    for rel, files in sorted(folders.items()):
        if (c := _folder_clip(fs, rel, files, out)) is not None:
            clips.append(c)
    for rel, stamp in sorted(videos.items()):
        if (c := _video_clip(fs, root, rel, stamp, out, storage_options)) is not None:
            clips.append(c)
    if not clips and not out.skipped:
        raise InputError(hr_url, "no clips found: folders of frames, or video files (" + " ".join(VIDEO_EXTENSIONS) + ")")
    lr_of: dict[str, list[tuple[int, _Clip]]] = {c.rel: [] for c in clips}
    for lr_url in lr_urls:
        _match_lr(lr_url, clips, lr_of, mod_crop, out, storage_options)
    pairs: list[Pair] = []
    keys: dict[str, str] = {}
    for c in clips:
        if lr_urls and len(lr_of[c.rel]) != len(lr_urls):
            continue  # its LR was missing or did not fit: already a problem
        key = _clip_key(c.rel, not c.frames)
        if key in keys:
            out.problem(c.url, f"maps to clip key {key!r} like {keys[key]} (keys must be unique)")
            continue
        keys[key] = c.url
        lr = sorted(lr_of[c.rel])
        for first, count, o0, o1 in plan_segments(c.count, opts):
            part = ClipPart(
                clip=key,
                first=first,
                count=count,
                clip_frames=c.count,
                owned=(o0, o1),
                hr_frames=tuple(storage.url_of(fs, p) for p in c.frames[first : first + count]),
                lr_frames=tuple(
                    (s, tuple(storage.url_of(fs, p) for p in lc.frames[first : first + count])) for s, lc in lr if lc.frames
                ),
                names=tuple(posixpath.basename(p) for p in c.frames[first : first + count])
                or tuple(f"frame {i}" for i in range(first, first + count)),
            )
            stamps = tuple(c.stamps[first : first + count] if c.frames else c.stamps)
            stamps += tuple(st for _, lc in lr for st in (lc.stamps[first : first + count] if lc.frames else lc.stamps))
            pairs.append(
                Pair(
                    key=f"{key}_f{first:06d}",
                    hr=c.url,
                    hr_rel=c.rel,
                    hr_size=c.size,
                    lr=tuple((s, lc.url, lc.rel) for s, lc in lr),
                    stamps=stamps,
                    clip=part,
                )
            )
    if not pairs:
        raise InputError(hr_url, "no usable clips (all skipped)")
    return sorted(pairs, key=lambda p: p.key), out.skipped, ignored


def _match_lr(
    lr_url: str,
    clips: list[_Clip],
    lr_of: dict[str, list[tuple[int, _Clip]]],
    mod_crop: bool,
    out: Collector,
    storage_options: dict[str, Any] | None,
) -> None:
    """Each HR clip's LR clip under ``lr_url`` (same relative folder and frame stems, or a video of
    the same relative stem), its scale from the sizes; one scale for the whole folder."""
    fs, root = open_root(lr_url, "LR clips folder", storage_options)
    folders, videos, _ = _list(fs, root, out)
    by_stem = {posixpath.splitext(rel)[0]: (rel, st) for rel, st in videos.items()}
    folder_scale: int | None = None
    for c in clips:
        lc: _Clip | None
        if c.frames:
            files = folders.get(c.rel)
            if not files:
                out.problem(c.url, f"has no LR clip in {lr_url} (looked for {c.rel}/)")
                continue
            lc = _folder_clip(fs, c.rel, files, out)
            if lc is None:
                continue
            hr_stems = [posixpath.splitext(posixpath.basename(p))[0] for p in c.frames]
            lr_stems = [posixpath.splitext(posixpath.basename(p))[0] for p in lc.frames]
            if hr_stems != lr_stems:
                extra = sorted(set(hr_stems) ^ set(lr_stems))[:3]
                out.problem(lc.url, f"LR frames differ from the HR clip's ({len(lr_stems)} vs {len(hr_stems)}; e.g. {extra})")
                continue
        else:
            found = by_stem.get(posixpath.splitext(c.rel)[0])
            if found is None:
                out.problem(c.url, f"has no LR video in {lr_url} (looked for {posixpath.splitext(c.rel)[0]}.*)")
                continue
            lc = _video_clip(fs, root, found[0], found[1], out, storage_options)
            if lc is None:
                continue
            if lc.count != c.count:
                out.problem(lc.url, f"has {lc.count} frames, the HR video {c.count}")
                continue
        try:
            s = scale_of(c.size, lc.size, mod_crop)
        except ValueError as exc:
            out.problem(lc.url, str(exc))
            continue
        if folder_scale is not None and s != folder_scale:
            out.problem(lc.url, f"is x{s}, other clips of {lr_url} are x{folder_scale} (one scale per LR folder)")
            continue
        folder_scale = s
        lr_of[c.rel].append((s, lc))


# ---- encoding one segment (in build worker processes) ----------------------------------------


def frame_member(side: str, t: int, ext: str) -> str:
    """A clip sample's member suffix for frame ``t`` of the segment: ``hr_f0003.png``, ``lr_x4_f0003.png``."""
    return f"{side}_f{t:04d}.{ext}"


def encode_segment(pair: Pair, cfg: Any) -> Any:
    """One segment's tar members: ``{key}.json`` then, frame by frame, ``{key}.hr_f{t:04d}.ext`` and
    ``{key}.lr_x{s}_f{t:04d}.ext`` (``tiles`` for frames stored tiled). Frames are read, checked
    (size, kind), their LR made (MATLAB per frame) or read, and encoded one at a time."""
    from shardmaker.builder.sample import EncodedSample, LrMethod, describe_kind, encode_image, tile_side, whole_lr

    part = pair.clip
    assert part is not None
    w, h = pair.hr_size
    provided = cfg.lr_method is LrMethod.PROVIDED
    scales = sorted(s for s, _, _ in pair.lr) if provided else sorted(cfg.scales)  # () for --hr-only
    tile = tile_side(cfg, (h, w), scales)
    ext = Codec(cfg.codec).value if tile is None else TILED
    members: dict[str, bytes] = {}
    kind: tuple[int, int] | None = None
    lr_sizes: dict[int, tuple[int, int]] = {}
    hr_frames = _frames(pair.hr, part.hr_frames, part, cfg)
    lr_iters = {s: _frames(url, dict(part.lr_frames).get(s, ()), part, cfg) for s, url, _ in pair.lr}
    for t, hr in enumerate(hr_frames):
        where = f"{pair.hr} ({part.names[t]})"
        if hr.shape[:2] != (h, w):
            raise InputError(where, f"frame is {hr.shape[1]}x{hr.shape[0]}, the clip's frames {w}x{h}")
        if kind is not None and describe_kind(hr) != kind:
            raise InputError(where, f"frame is {describe_kind(hr)} (bit depth, channels), the clip's {kind}")
        kind = describe_kind(hr)
        lrs: dict[int, np.ndarray] = {}
        for s in scales:
            if provided:
                lr = next(lr_iters[s])
                if not pair_fits((h, w), lr.shape[:2], s) or describe_kind(lr) != kind:
                    raise InputError(where, f"LR frame {lr.shape[1]}x{lr.shape[0]} {describe_kind(lr)} does not fit at x{s}")
            else:
                if (h % s or w % s) and not cfg.mod_crop:
                    raise InputError(pair.hr, f"{w}x{h} frames are not a multiple of the scale {s} (allow with --mod-crop)")
                method = cfg.lr_method.resize
                lr = whole_lr(hr, s, method)
            lrs[s] = lr
            lr_sizes[s] = (lr.shape[1], lr.shape[0])
        try:
            members[frame_member("hr", t, ext)] = encode_image(hr, cfg, tile)
            for s, lr in lrs.items():
                members[frame_member(f"lr_x{s}", t, ext)] = encode_image(lr, cfg, None if tile is None else tile // s)
        except ImageDataError as exc:
            raise InputError(where, str(exc)) from None
    if len(members) != part.count * (1 + len(scales)):
        raise InputError(pair.hr, f"gave {len(members) // (1 + len(scales))} of the segment's {part.count} frames")
    assert kind is not None
    meta: dict[str, Any] = {
        "key": pair.key,
        "source": pair.hr_rel,
        "clip": part.clip,
        "clip_frames": part.clip_frames,
        "first_frame": part.first,
        "frames": part.count,
        "owned": list(part.owned),
        "frame_names": list(part.names),
        "hr_size": [w, h],
        "scales": scales,
        "bit_depth": kind[0],
        "channels": kind[1],
        "lr_method": cfg.lr_method.value,
        "lr_sizes": {str(s): list(v) for s, v in lr_sizes.items()},
        "hr_crop": {str(s): [s * v[0], s * v[1]] for s, v in lr_sizes.items()},
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in members.items()},
        "xxh3_64": {name: xxhash.xxh3_64_hexdigest(data) for name, data in members.items()},
    }
    if tile is not None:
        meta["tiles"] = tile
    if provided:
        meta["lr_sources"] = {str(s): rel for s, _, rel in pair.lr}
    blob = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    parts = [tario.member_bytes(f"{pair.key}.json", blob)]
    parts += [tario.member_bytes(f"{pair.key}.{name}", data) for name, data in members.items()]
    del members
    return EncodedSample(pair.key, b"".join(parts), (w, h), tile or 0)


def _frames(url: str, frame_urls: Sequence[str], part: ClipPart, cfg: Any) -> Iterator[np.ndarray]:
    """The segment's frames in order: each frame file read and checked as a source image, or the
    video decoded frame-exactly."""
    from shardmaker.builder.sample import SourceImage

    if frame_urls:
        for f in frame_urls:
            with SourceImage(f, cfg) as img:
                yield img.whole()
        return
    yield from video_frames(url, part.first, part.count, cfg.storage_options)


def clip_record(pairs: Sequence[Pair], opts: ClipOptions) -> dict[str, Any]:
    """The build's ``clips`` record: segment length, longest window, how many clips and frames."""
    clips = {p.clip.clip: p.clip.clip_frames for p in pairs if p.clip is not None}
    return {"segment": opts.segment, "max_span": opts.max_span, "clips": len(clips), "frames": sum(clips.values())}
