"""Find HR images, pair them with provided LR images, and decide each LR folder's scale.

Pairing: an LR file pairs with the HR file of the same relative stem, or of that stem with an
``x{s}`` suffix removed (``0001x4.png``, ``babyx4.png``: DIV2K and Set5 naming). The scale is
read from the size ratio (HR may exceed s x LR by less than s on each side: the usual mod-crop).
With an LR name pattern (``--lr-pattern '{stem}_LRBI_x{s}'``), an LR file pairs only with the HR
file whose stem the pattern gives, and a ``{s}`` in its name must agree with the size ratio.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import re
import stat
import string
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from shardmaker import storage
from shardmaker.builder.clipplan import ClipPart
from shardmaker.builder.regions import Region, plan_regions, region_count
from shardmaker.errors import InputError, OnError, ShardmakerError, unreadable
from shardmaker.format import patterns
from shardmaker.imaging import codecs
from shardmaker.imaging.regions import TiffFallback, TiffRegions, is_tiff

log = logging.getLogger(__name__)
_XSUFFIX = re.compile(r"^(.*?)x(\d+)$")
_PATTERN_FIELDS = {"stem": r"(?P<stem>.+)", "s": r"(?P<s>\d+)"}
# (filesystem, paths, path -> listing stamp) -> each file's (w, h), or the InputError that says why not
Sizer = Callable[[Any, Sequence[str], Mapping[str, str]], list[tuple[int, int] | InputError]]


def lr_name_pattern(pattern: str) -> re.Pattern[str]:
    """``--lr-pattern`` (``{stem}_LRBI_x{s}``: the LR file's stem from the HR stem and the scale,
    no extension) as a regex matching LR stems; ValueError in one line when it is not one."""
    what = f"--lr-pattern {pattern!r}"
    try:
        fields = list(string.Formatter().parse(pattern))
    except ValueError as exc:
        raise ValueError(f"{what}: {exc} (write it like '{{stem}}_LRBI_x{{s}}')") from None
    regex, seen = "", set()
    for literal, name, spec, conversion in fields:
        regex += re.escape(literal)
        if name is None:
            continue
        if name not in _PATTERN_FIELDS or spec or conversion:
            raise ValueError(f"{what}: only the fields {{stem}} and {{s}} are allowed, got {{{name}}}")
        regex += f"(?P={name})" if name in seen else _PATTERN_FIELDS[name]
        seen.add(name)
    if "stem" not in seen:
        raise ValueError(f"{what}: must contain {{stem}}, the HR file's name without extension")
    if pattern.lower().endswith(codecs.SOURCE_EXTENSIONS):
        raise ValueError(f"{what}: give the name without its extension")
    return re.compile(regex)


@dataclasses.dataclass(frozen=True)
class Pair:
    """One sample's sources: the HR image and, if provided, one LR image per scale."""

    key: str
    hr: str  # URL or local path
    hr_rel: str
    hr_size: tuple[int, int]  # (w, h)
    lr: tuple[tuple[int, str, str], ...] = ()  # (scale, URL, relative path), ascending scale
    stamps: tuple[str, ...] = ()  # size + modification stamp of HR, then of each LR: an edit changes them
    region: Region | None = None  # a region sample: this part of the source image (hr_size is the region's)
    image_size: tuple[int, int] | None = None  # a region sample's whole source image (w, h)
    clip: ClipPart | None = None  # a clip segment (shardmaker.builder.clips): hr is the clip folder or video


@dataclasses.dataclass(frozen=True)
class Skipped:
    path: str
    reason: str
    key: str | None = None  # a dropped region's key
    valid: float | None = None  # a region dropped by --min-valid: its share of non-flat content (not an error)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "reason": self.reason}
        if self.valid is not None:
            d |= {"key": self.key, "valid": self.valid}
        return d


def split_regions(
    pairs: Sequence[Pair],
    side: int,
    scales: Sequence[int] | None = None,
    max_pixels: int | None = None,
    out: Collector | None = None,
) -> list[Pair]:
    """Each pair whose image is larger than ``side`` on a side as its region samples
    (:func:`~shardmaker.builder.regions.plan_regions`: keys ``{key}_y{Y}_x{X}``), in key order; the
    others as they are. ``scales``: the generated scales (provided LR: each pair's own).
    ``max_pixels`` bounds the whole image, also one read by region: a larger one is ``out``'s problem
    (named with its size and region count; raised without ``out``), never planned."""
    res: list[Pair] = []
    for p in pairs:
        w, h = p.hr_size
        if max(w, h) <= side:
            res.append(p)
            continue
        step_scales = list(scales) if scales else [s for s, _, _ in p.lr] or [1]
        if max_pixels is not None and w * h > max_pixels:
            n = region_count(h, w, side, step_scales)
            reason = (
                f"{w}x{h} = {w * h} pixels ({n} regions of up to {side}x{side}) is over the limit of {max_pixels} "
                "(a sparse or forged TIFF?); raise --max-pixels to at least the image's pixels if it is genuine"
            )
            (out or Collector(OnError.FAIL)).problem(p.hr, reason)
            continue
        for r in plan_regions(h, w, side, step_scales):
            res.append(dataclasses.replace(p, key=r.key(p.key), hr_size=(r.w, r.h), region=r, image_size=(w, h)))
    return sorted(res, key=lambda p: p.key)


def make_key(rel_path: str) -> str:
    """Relative path without extension, ``/`` kept, every ``.`` replaced by ``_``."""
    stem, _ = posixpath.splitext(rel_path)
    return stem.replace(".", "_")


def stamp_of(info: dict[str, Any]) -> str:
    """What changes when a file is edited in place: size + mtime_ns locally, size + ETag/mtime elsewhere."""
    name = info.get("name", "")
    if isinstance(name, str) and info.get("type") == "file" and "mtime" in info and "ETag" not in info:
        try:
            st = os.stat(name)
            return f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            pass
    tag = info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime") or ""
    return f"{info.get('size')}:{tag}"


def _list_images(
    fs: fsspec.AbstractFileSystem,
    root: str,
    exclude: Iterable[str] = (),
    problem: Any = None,
    ignored: list[str] | None = None,
) -> dict[str, str]:
    """Image files under ``root``: path -> stamp. Files that are not regular files (FIFOs,
    sockets, devices) and names that are not UTF-8 are reported to ``problem`` and left out; files
    without an image extension (``notes.txt``) are added to ``ignored`` (hidden files are not).
    Symbolic links to files are followed, also where they point outside ``root``; a dangling one
    is a problem, one to a FIFO or device is left out like the FIFO itself, one to a folder is left
    out with a warning (fsspec does not walk it)."""
    excluded = [e.rstrip("/") + "/" for e in exclude]
    found = {}
    for path, info in sorted(fs.find(root, detail=True).items()):
        base = posixpath.basename(path)
        if base.startswith(".") or any(path.startswith(e) for e in excluded):
            continue
        if info.get("islink") and storage.is_local(fs) and os.path.isdir(path):  # never walked: no cycles
            log.warning("skipping %s: a symbolic link to a folder (not followed; link the files, or give the folder)", path)
            continue
        if not base.lower().endswith(codecs.SOURCE_EXTENSIONS):
            if ignored is not None:
                ignored.append(storage.url_of(fs, path))
            continue
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            (problem or _raise)(shown, "file name is not valid UTF-8 (rename it)")
            continue
        if info.get("islink") and storage.is_local(fs):
            info = follow_link(path, info, problem or _raise)
            if info is None:
                continue
        if info.get("type") != "file":
            log.warning("skipping %s: not a regular file (%s)", path, info.get("type"))
            continue
        found[path] = stamp_of(info)
    return found


def follow_link(path: str, info: dict[str, Any], problem: Any) -> dict[str, Any] | None:
    """A local symbolic link's listing entry as that of the file it points to (fsspec types every
    link ``"other"``), or None, reported, where it points to nothing (``problem``: the image the
    link names is missing) or to something that is not a regular file (a warning, as for a FIFO)."""
    try:
        st = os.stat(path)  # follows the link (and links to links)
    except OSError as exc:
        problem(path, f"symbolic link to {info.get('destination', '?')} that cannot be followed ({exc.strerror})")
        return None
    if not stat.S_ISREG(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO, socket or device"
        log.warning("skipping %s: a symbolic link to %s, not to a regular file", path, what)
        return None
    return {**info, "type": "file", "size": st.st_size, "mtime": st.st_mtime}


def scan_sources(
    hr_srcs: Sequence[str],
    lr_urls: Iterable[str] = (),
    mod_crop: bool = True,
    on_error: OnError = OnError.FAIL,
    storage_options: dict[str, Any] | None = None,
    lr_pattern: str | None = None,
    sizer: Sizer | None = None,
) -> tuple[list[Pair], list[Skipped], list[str]]:
    """Pairs (with the skipped sources and the files that are not images, as :func:`scan`) from one
    or several HR sources: folders, or brace patterns of image files (``photos/{0001..0800}.png``).
    One folder is :func:`scan` itself. Otherwise each source's keys
    start with its path relative to the sources' common folder (``DIV2K/0001``, ``Flickr2K/000001``),
    so keys from different sources never collide; LR folders (``--lr``) pair with one HR folder only."""
    hr_srcs = list(hr_srcs)
    if len(hr_srcs) == 1 and "{" not in hr_srcs[0]:
        return scan(hr_srcs[0], lr_urls, mod_crop, on_error, storage_options, lr_pattern=lr_pattern, sizer=sizer)
    if list(lr_urls):
        raise InputError(hr_srcs[0], "--lr pairs with one HR folder; build each dataset and mix them (SRDataset([a, b]))")
    groups: list[tuple[str, frozenset[str] | None]] = []  # (folder URL, files in it or None for all)
    fs = None
    for src in hr_srcs:
        if "{" in src:
            files = patterns.expand_braces(src)  # counted first: refused above MAX_NAMES
            fs2, _ = url_to_fs(files[0], **(storage_options or {}))
            paths = [url_to_fs(f, **(storage_options or {}))[1] for f in files]
            parents = {posixpath.dirname(pp) for pp in paths}
            parent = posixpath.commonpath(sorted(parents))
            groups.append((storage.url_of(fs2, parent), frozenset(paths)))
        else:
            fs2, _ = url_to_fs(src, **(storage_options or {}))
            groups.append((src, None))
        if fs is not None and type(fs2) is not type(fs):
            raise InputError(src, "HR sources must be on one filesystem")
        fs = fs2
    roots = [url_to_fs(u, **(storage_options or {}))[1].rstrip("/") for u, _ in groups]
    common = roots[0] if len(roots) == 1 else posixpath.commonpath(roots)  # one pattern: no prefix
    pairs: list[Pair] = []
    skipped: list[Skipped] = []
    ignored: list[str] = []
    for (url, only), root in zip(groups, roots, strict=True):
        prefix = posixpath.relpath(root, common) if root != common else ""
        got, skip, other = scan(url, (), mod_crop, on_error, storage_options, only=only, key_prefix=prefix, sizer=sizer)
        pairs += got
        skipped += skip
        ignored += other if only is None else []  # a pattern names its files: the others were not asked for
    seen: dict[str, str] = {}
    for p in pairs:
        if p.key in seen:
            raise InputError(p.hr, f"maps to key {p.key!r} like {seen[p.key]} (an image given twice?)")
        seen[p.key] = p.hr
    return sorted(pairs, key=lambda p: p.key), skipped, ignored


def _raise(path: str, reason: str) -> None:
    raise InputError(path, reason)


def open_root(url: str, what: str, storage_options: dict[str, Any] | None) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, root = storage.open_dir(url, storage_options)
    if not fs.exists(root):
        raise InputError(url, f"{what} does not exist")
    if not fs.isdir(root):
        raise InputError(url, f"{what} is a file, not a folder")
    return fs, root


def header_size(fs: fsspec.AbstractFileSystem, path: str, ext: str | None = None) -> tuple[int, int]:
    """Image ``(w, h)`` from its header: the first 64 KiB, or the whole file if needed (TIFF).
    With ``ext``, the content must be of the format the extension names."""
    try:
        with storage.open_input(fs, path) as f:  # a FIFO or device swapped in since the scan: InputError, no wait
            head = f.read(1 << 16)
            if is_tiff(head) and (ext is None or ext.lower().lstrip(".") in ("tif", "tiff")):
                f.seek(0)  # tifffile reads the header and the first page's tags only, whatever the file's size
                try:
                    with TiffRegions(f, drop_alpha=True, name=posixpath.basename(path)) as tif:
                        return tif.width, tif.height
                except TiffFallback:  # palette, CMYK, ...: what SourceImage leaves to Pillow, sized by Pillow here
                    f.seek(len(head))
            try:
                return codecs.image_size(head, ext)
            except codecs.ImageDataError:
                if len(head) < (1 << 16):
                    raise
            head += f.read()
        return codecs.image_size(head, ext)
    except codecs.ImageDataError as exc:
        raise InputError(path, str(exc)) from None
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc})") from None
    except ShardmakerError:
        raise
    except Exception as exc:  # noqa: BLE001 - a decoder's own error on a crafted header: the file's error
        raise InputError(path, unreadable(exc)) from None


def header_sizes(fs: Any, paths: Sequence[str], stamps: Mapping[str, str]) -> list[tuple[int, int] | InputError]:
    """Each file's ``(w, h)`` from its header (:func:`header_size`), one after another; an unreadable
    file's InputError in its place. The default :data:`Sizer` (``stamps`` unused)."""
    out: list[tuple[int, int] | InputError] = []
    for path in paths:
        try:
            out.append(header_size(fs, path, posixpath.splitext(path)[1]))
        except InputError as exc:
            out.append(exc)
    return out


def scale_of(hr_size: tuple[int, int], lr_size: tuple[int, int], mod_crop: bool) -> int:
    """Integer scale s with HR = s x LR (+ less than s with mod-crop); ValueError otherwise."""
    (hw, hh), (lw, lh) = hr_size, lr_size
    if lw < 1 or lh < 1 or hw < lw or hh < lh:
        raise ValueError(f"LR {lw}x{lh} is not smaller than HR {hw}x{hh}")
    sw, sh = hw // lw, hh // lh
    if sw != sh or sw < 2:
        raise ValueError(f"HR {hw}x{hh} / LR {lw}x{lh} is not one integer scale on both axes")
    s = sw
    rw, rh = hw - s * lw, hh - s * lh
    if rw >= s or rh >= s:
        raise ValueError(f"HR {hw}x{hh} is more than a mod-crop larger than {s} x LR {lw}x{lh}")
    if (rw or rh) and not mod_crop:
        raise ValueError(f"HR {hw}x{hh} is not exactly {s} x LR {lw}x{lh} (allow with --mod-crop)")
    return s


class Collector:
    """Raise on the first problem, or record it and go on (``--on-error skip``)."""

    def __init__(self, on_error: OnError) -> None:
        self.skip = on_error is OnError.SKIP
        self.skipped: list[Skipped] = []
        self.ignored: list[str] = []  # files that are not images by their extension: listed, never an error

    def problem(self, path: str, reason: str) -> None:
        if not self.skip:
            raise InputError(path, reason)
        log.debug("skipping %s: %s", path, reason)  # logged by the build, a few per reason (format.manifest.Skips)
        self.skipped.append(Skipped(path, reason))


def scan(
    hr_url: str,
    lr_urls: Iterable[str] = (),
    mod_crop: bool = True,
    on_error: OnError = OnError.FAIL,
    storage_options: dict[str, Any] | None = None,
    only: frozenset[str] | None = None,
    key_prefix: str = "",
    lr_pattern: str | None = None,
    sizer: Sizer | None = None,
) -> tuple[list[Pair], list[Skipped], list[str]]:
    """All pairs under ``hr_url``, sorted by key, the problems listed when skipping (else raised) and
    the files that are not images by their extension.
    ``only``: just these image paths under it; ``key_prefix``: put before every key and relative name;
    ``lr_pattern``: how LR files are named (:func:`lr_name_pattern`; default: same stem or stem + x{s});
    ``sizer``: how the images' sizes are read (default :func:`header_sizes`; ``shardmaker index`` reads
    each file once there, its digest with its header)."""
    lr_urls = list(lr_urls)
    if lr_pattern is not None:
        lr_name_pattern(lr_pattern)  # a bad pattern fails before any folder is read
    fs, hr_root = open_root(hr_url, "HR source folder", storage_options)
    lr_roots = [open_root(u, "LR source folder", storage_options) for u in lr_urls]
    out = Collector(OnError(on_error))
    hr_stamps = _list_images(fs, hr_root, [r for f2, r in lr_roots if f2 is fs], out.problem, out.ignored)
    if only is not None:
        missing = sorted(only - set(hr_stamps))
        if missing:
            raise InputError(storage.url_of(fs, missing[0]), "no such image (named by the HR_SRC pattern)")
        hr_stamps = {k: v for k, v in hr_stamps.items() if k in only}
    if not hr_stamps:
        raise InputError(hr_url, f"no images found (looked for {', '.join(codecs.SOURCE_EXTENSIONS)})")
    sizer = sizer or header_sizes
    hr = _hr_images(hr_url, fs, hr_root, hr_stamps, key_prefix, out, sizer)
    stamps: dict[str, str] = dict(hr_stamps)
    for url, (lfs, lroot) in zip(lr_urls, lr_roots, strict=True):
        _match_lr_folder(url, lfs, lroot, hr, stamps, mod_crop, out, lr_pattern, sizer)
    pairs = []
    for key in sorted(hr.by_key):
        if key in hr.bad:
            continue
        hr_path = hr.by_key[key]
        pairs.append(
            Pair(
                key=key,
                hr=storage.url_of(fs, hr_path),
                hr_rel=posixpath.join(key_prefix, hr.rel[key]) if key_prefix else hr.rel[key],
                hr_size=hr.sizes[key],
                lr=tuple(sorted(hr.lr_of[key])),
                stamps=(hr_stamps[hr_path], *(stamps[u] for _, u, _ in sorted(hr.lr_of[key]))),
            )
        )
    if lr_urls and pairs:
        first = [s for s, _, _ in pairs[0].lr]
        for p in pairs:
            if [s for s, _, _ in p.lr] != first:  # pragma: no cover - guarded by per-folder scale
                raise InputError(p.hr, "LR scales differ between samples")
    if not pairs:
        raise InputError(hr_url, "no usable HR/LR pairs (all skipped)")
    return pairs, out.skipped, out.ignored


@dataclasses.dataclass
class _HrImages:
    """The HR side of a scan: each key's image, relative name and size, the keys that went bad,
    and the LR images found for each so far."""

    url: str
    by_key: dict[str, str]
    rel: dict[str, str]
    stem_to_key: dict[str, str]
    sizes: dict[str, tuple[int, int]]
    bad: set[str]
    lr_of: dict[str, list[tuple[int, str, str]]]


def _hr_images(
    hr_url: str, fs: Any, hr_root: str, stamps: dict[str, str], key_prefix: str, out: Collector, sizer: Sizer
) -> _HrImages:
    by_key: dict[str, str] = {}
    hr_rel: dict[str, str] = {}
    for path in stamps:
        rel = posixpath.relpath(path, hr_root)
        key = make_key(posixpath.join(key_prefix, rel) if key_prefix else rel)
        if key in by_key:
            out.problem(path, f"maps to key {key!r} like {by_key[key]} (keys must be unique)")
            continue
        by_key[key] = path
        hr_rel[key] = rel
    sizes: dict[str, tuple[int, int]] = {}
    bad: set[str] = set()
    for key, got in zip(by_key, sizer(fs, list(by_key.values()), stamps), strict=True):
        if isinstance(got, InputError):
            out.problem(got.path, got.reason)
            bad.add(key)
        else:
            sizes[key] = got
    stem_to_key = {posixpath.splitext(r)[0]: k for k, r in hr_rel.items()}
    return _HrImages(hr_url, by_key, hr_rel, stem_to_key, sizes, bad, {k: [] for k in by_key})


def hr_stem_of(lr_stem: str, hr_stems: Container[str], names: re.Pattern[str] | None = None) -> tuple[str | None, int | None]:
    """The HR stem (one of ``hr_stems``) an LR file's stem pairs with, and the scale its name says (None
    where it says none): the same stem, else the stem without an ``x{s}`` suffix (``babyx4`` -> ``baby``);
    with ``names`` (:func:`lr_name_pattern`) only the stem the pattern gives. ``(None, ...)``: no HR."""
    if names is not None:
        m = names.fullmatch(lr_stem)
        if m is None:
            return None, None
        stem = m.group("stem")
        return (stem if stem in hr_stems else None), int(m.group("s")) if "s" in names.groupindex else None
    if lr_stem in hr_stems:
        return lr_stem, None
    m = _XSUFFIX.match(lr_stem)
    if m:
        return (m.group(1) if m.group(1) in hr_stems else None), int(m.group(2))
    return None, None


def _hr_key_of(stem: str, hr: _HrImages, names: re.Pattern[str] | None) -> tuple[str | None, int | None]:
    """The HR key an LR stem pairs with, and the scale its name says (None where it says none)."""
    hr_stem, scale = hr_stem_of(stem, hr.stem_to_key, names)
    return (None if hr_stem is None else hr.stem_to_key[hr_stem]), scale


def _match_lr_folder(
    url: str,
    lfs: Any,
    lroot: str,
    hr: _HrImages,
    stamps: dict[str, str],
    mod_crop: bool,
    out: Collector,
    lr_pattern: str | None = None,
    sizer: Sizer = header_sizes,
) -> None:
    """Pair the LR images of one ``--lr`` folder with the HR images (one scale per folder)."""
    names = lr_name_pattern(lr_pattern) if lr_pattern is not None else None
    matched: dict[str, str] = {}
    dir_scale: int | None = None
    dir_example = ""
    lr_stamps = _list_images(lfs, lroot, problem=out.problem, ignored=out.ignored)
    keys = {p: _hr_key_of(posixpath.splitext(posixpath.relpath(p, lroot))[0], hr, names) for p in lr_stamps}
    want = [p for p, (k, _) in keys.items() if k is not None and k not in hr.bad]  # the LR files that may pair: sized at once
    lr_sizes = dict(zip(want, sizer(lfs, want, lr_stamps), strict=True))
    for lpath in lr_stamps:
        stamps[storage.url_of(lfs, lpath)] = lr_stamps[lpath]
        lrel = posixpath.relpath(lpath, lroot)
        key, suffix_scale = keys[lpath]
        if key is None:
            rule = f"named by --lr-pattern {lr_pattern!r}" if lr_pattern else "same relative name, or name + 'x<scale>'"
            out.problem(lpath, f"LR image has no HR image in {hr.url} ({rule})")
            continue
        if key in matched:
            out.problem(lpath, f"second LR image for HR {hr.by_key[key]} in this folder (first: {matched[key]})")
            continue
        matched[key] = lpath
        if key in hr.bad:
            continue
        try:
            got = lr_sizes[lpath]
            if isinstance(got, InputError):
                raise got
            s = scale_of(hr.sizes[key], got, mod_crop)
            if suffix_scale is not None and suffix_scale != s:
                raise ValueError(f"name says x{suffix_scale} but the size ratio is {s}")
            if dir_scale is not None and s != dir_scale:
                raise ValueError(f"scale {s}, but {dir_example} in the same LR folder has scale {dir_scale}")
        except InputError as exc:
            out.problem(exc.path, exc.reason)
            hr.bad.add(key)
            continue
        except ValueError as exc:
            out.problem(lpath, f"{exc} (HR: {hr.by_key[key]})")
            hr.bad.add(key)
            continue
        if dir_scale is None:
            dir_scale, dir_example = s, lpath
        if any(s == prev for prev, _, _ in hr.lr_of[key]):
            out.problem(lpath, f"a second LR folder with scale {s} (only one folder per scale)")
            hr.bad.add(key)
            continue
        hr.lr_of[key].append((s, storage.url_of(lfs, lpath), lrel))
    for key, path in hr.by_key.items():
        if key not in matched and key not in hr.bad:
            out.problem(path, f"HR image has no LR image in {url}")
            hr.bad.add(key)
