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
import posixpath
import re
from collections.abc import Sequence
from typing import Any

from shardmaker import storage
from shardmaker.builder.clipplan import DEFAULT_MAX_SPAN, DEFAULT_SEGMENT, ClipOptions, ClipPart, plan_segments
from shardmaker.builder.sources import Collector, Pair, Skipped, follow_link, header_size, make_key, open_root, scale_of, stamp_of
from shardmaker.builder.video import DEFAULT_MAX_PIXELS, VIDEO_EXTENSIONS, video_info
from shardmaker.errors import InputError, OnError
from shardmaker.imaging import codecs

__all__ = [
    "DEFAULT_MAX_SPAN",
    "DEFAULT_SEGMENT",
    "VIDEO_EXTENSIONS",
    "ClipOptions",
    "ClipPart",
    "clip_record",
    "natural_key",
    "plan_segments",
    "scan_clips",
]

DEFAULT_OPTIONS = ClipOptions()


def natural_key(name: str) -> list[Any]:
    """``frame2`` before ``frame10``: digit runs compare as numbers."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t.lower()) for t in re.split(r"(\d+)", name) if t]


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
    pts: tuple[int, ...] = ()  # a video's frame timestamps in presentation order (one demux, at scan time)


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
        if info.get("islink") and storage.is_local(fs):
            info = follow_link(path, info, out.problem)
            if info is None:
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


@dataclasses.dataclass(frozen=True)
class _Limits:
    """What a video's stream is checked against at scan time (the build's --max-pixels, --drop-alpha)."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    drop_alpha: bool = False


def _video_clip(
    fs: Any, root: str, rel: str, stamp: str, out: Collector, options: dict[str, Any] | None, limits: _Limits
) -> _Clip | None:
    url = storage.url_of(fs, posixpath.join(root, rel))
    try:
        size, pts = video_info(url, options, limits.max_pixels, limits.drop_alpha)
    except InputError as exc:
        out.problem(exc.path, exc.reason)
        return None
    return _Clip(rel, url, [], size, len(pts), [stamp], tuple(pts))


def _clip_key(rel: str, video: bool) -> str:
    """A video's relative path without extension, a folder's relative path (``.`` as ``_``);
    frames directly in the clips folder: ``clip``."""
    return make_key(rel) if video else rel.replace(".", "_") or "clip"


def scan_clips(
    hr_url: str,
    lr_urls: Sequence[str] = (),
    opts: ClipOptions = DEFAULT_OPTIONS,
    mod_crop: bool = True,
    on_error: OnError = OnError.FAIL,
    storage_options: dict[str, Any] | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    drop_alpha: bool = False,
) -> tuple[list[Pair], list[Skipped], list[str]]:
    """One pair per clip segment under ``hr_url`` (sorted by key), the clips skipped (``skip``) and
    the files that are neither frames nor videos. LR clips (``--lr``) sit at the same relative
    paths under each LR folder, with the same frame names (or as videos of the same name), one
    scale per folder, every frame checked HR = s x LR from its header. A video's declared frame size
    is checked against ``max_pixels``, and its pixel format for alpha (``drop_alpha``), before any decode."""
    limits = _Limits(max_pixels, drop_alpha)
    fs, root = open_root(hr_url, "clips folder", storage_options)
    out = Collector(OnError(on_error))
    folders, videos, ignored = _list(fs, root, out)
    clips: list[_Clip] = []
    for rel, files in sorted(folders.items()):
        if (c := _folder_clip(fs, rel, files, out)) is not None:
            clips.append(c)
    for rel, stamp in sorted(videos.items()):
        if (c := _video_clip(fs, root, rel, stamp, out, storage_options, limits)) is not None:
            clips.append(c)
    if not clips and not out.skipped:
        raise InputError(hr_url, "no clips found: folders of frames, or video files (" + " ".join(VIDEO_EXTENSIONS) + ")")
    lr_of: dict[str, list[tuple[int, _Clip]]] = {c.rel: [] for c in clips}
    for lr_url in lr_urls:
        _match_lr(lr_url, clips, lr_of, mod_crop, out, storage_options, limits)
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
                hr_pts=c.pts[first : first + count],
                lr_pts=tuple((s, lc.pts[first : first + count]) for s, lc in lr if lc.pts),
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
    limits: _Limits,
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
            lc = _video_clip(fs, root, found[0], found[1], out, storage_options, limits)
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


def clip_record(pairs: Sequence[Pair], opts: ClipOptions) -> dict[str, Any]:
    """The build's ``clips`` record: segment length, longest window, how many clips and frames."""
    clips = {p.clip.clip: p.clip.clip_frames for p in pairs if p.clip is not None}
    return {"segment": opts.segment, "max_span": opts.max_span, "clips": len(clips), "frames": sum(clips.values())}
