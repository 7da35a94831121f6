"""The ``wdsr-shards/1`` format: the one door to shard data, for ``shardmaker`` and ``wdsr`` alike.

Everything read from a dataset passes through here and trusts nothing it reads:

* :mod:`.manifest` (+ :mod:`.schema`, :mod:`.columns`) -- ``manifest.json`` checked against the schema (types, ranges, shard names
  that are one file name, unique keys, 64-hex sha256, offsets and sizes consistent); a shard's
  location is always ``dataset + "/" + name`` (:func:`shard_path`). Failures are
  :class:`ManifestError` (where, field, reason).
* :mod:`.loading` -- :func:`load` a dataset's manifest, from ``manifest.json`` or memory-mapped from
  its column index (:mod:`.colread`); :func:`load_index` reads it as the streaming reader does (:mod:`.colverify`:
  :func:`index_problems`, the index against the manifest column by column); :func:`locate` splits a
  manifest URL into folder and name.
* :mod:`.header` -- the per-sample header ``{key}.json`` (:class:`SampleHeader`): its one parser
  (:meth:`SampleHeader.parse`, every field typed and bounded), its one encoder (:meth:`SampleHeader.encode`,
  the bytes the build writes); :mod:`.digests`: the one digest check (:func:`check_digests`); failures are
  :class:`SampleHeaderError` (shard, key, reason). Member names (``hr.png``, ``lr_x4.png``, a clip's
  ``hr_f0003.png``) and the clip limits live in :mod:`.schema`.
* :mod:`.tario` -- tar members parsed with every size bounded by the bytes left, so parsing always
  moves forward; bad headers, sizes, checksums or names are :class:`TarFormatError`.
* :mod:`.headers` -- PNG/QOI headers checked against the manifest's HR size, the scale, channels,
  depth and a pixel limit before any decode (:class:`HeaderError`).
* :mod:`.tiles` -- tiled image members (header, tile index, independent tiles): counts, offsets and
  lengths checked against the member's bytes, each tile's header against its box
  (:class:`TileFormatError`).
* :mod:`.patterns` -- brace patterns of shard URLs, counted before they are expanded (as
  ``braceexpand`` does), refused above :data:`MAX_NAMES` (:class:`PatternError`).

Readers turn these into ``wdsr.SampleError`` (shard, key, reason); messages never quote file bytes.
"""

from shardmaker.format import tiles
from shardmaker.format.colverify import index_problems
from shardmaker.format.digests import DigestAlgorithm, Digests, SampleHeaderError, check_digest, check_digests
from shardmaker.format.files import MISSING as FILE_MISSING
from shardmaker.format.files import stamp_digest
from shardmaker.format.header import ClipSpan, SampleHeader, parse_digests
from shardmaker.format.headers import DEFAULT_MAX_PIXELS, HeaderError, ImageHeader, check_pair, image_header
from shardmaker.format.loading import load, load_index, locate
from shardmaker.format.manifest import Manifest, ShardInfo, kind_text, parse
from shardmaker.format.patterns import MAX_NAMES, PatternError, count_braces, expand_braces
from shardmaker.format.schema import (
    FORMAT,
    FRAME_MEMBER,
    JSON_MEMBER,
    MANIFEST,
    MAX_CLIP_FRAMES,
    MAX_SEGMENT,
    MIXED,
    TILED,
    ManifestError,
    check_shard_name,
    clip_ext,
    clip_members,
    frame_member,
    hr_frame,
    hr_member,
    lr_frame,
    lr_member,
    pair_fits,
    probe_file,
    shard_path,
)
from shardmaker.format.tario import MemberAt, TarFormatError, iter_entries, iter_members, iter_samples, split_name
from shardmaker.format.tiles import TiledHeader, TileFormatError

__all__ = [
    "ClipSpan",
    "FRAME_MEMBER",
    "DEFAULT_MAX_PIXELS",
    "DigestAlgorithm",
    "Digests",
    "FORMAT",
    "HeaderError",
    "ImageHeader",
    "JSON_MEMBER",
    "MANIFEST",
    "MAX_CLIP_FRAMES",
    "MAX_NAMES",
    "MAX_SEGMENT",
    "Manifest",
    "ManifestError",
    "MemberAt",
    "PatternError",
    "SampleHeader",
    "SampleHeaderError",
    "ShardInfo",
    "MIXED",
    "TILED",
    "TarFormatError",
    "TileFormatError",
    "TiledHeader",
    "check_digest",
    "check_digests",
    "check_pair",
    "check_shard_name",
    "clip_ext",
    "clip_members",
    "count_braces",
    "expand_braces",
    "frame_member",
    "hr_frame",
    "hr_member",
    "image_header",
    "iter_entries",
    "iter_members",
    "iter_samples",
    "kind_text",
    "index_problems",
    "load",
    "load_index",
    "locate",
    "lr_frame",
    "lr_member",
    "pair_fits",
    "parse",
    "parse_digests",
    "probe_file",
    "shard_path",
    "stamp_digest",
    "FILE_MISSING",
    "split_name",
    "tiles",
]
