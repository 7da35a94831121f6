"""The ``wdsr-shards/1`` format: the one door to shard data, for ``shardmaker`` and ``wdsr`` alike.

Everything read from a dataset passes through here and trusts nothing it reads:

* :mod:`.manifest` (+ :mod:`.schema`, :mod:`.columns`) -- ``manifest.json`` checked against the schema (types, ranges, shard names
  that are one file name, unique keys, 64-hex sha256, offsets and sizes consistent); a shard's
  location is always ``dataset + "/" + name`` (:func:`shard_path`). Failures are
  :class:`ManifestError` (where, field, reason).
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
from shardmaker.format.headers import DEFAULT_MAX_PIXELS, HeaderError, ImageHeader, check_pair, image_header
from shardmaker.format.manifest import Manifest, ShardInfo, kind_text, load, locate, parse
from shardmaker.format.patterns import MAX_NAMES, PatternError, count_braces, expand_braces
from shardmaker.format.schema import (
    FORMAT,
    JSON_MEMBER,
    MANIFEST,
    TILED,
    ManifestError,
    check_shard_name,
    hr_member,
    lr_member,
    pair_fits,
    probe_file,
    shard_path,
)
from shardmaker.format.tario import MemberAt, TarFormatError, iter_entries, iter_members, iter_samples, split_name
from shardmaker.format.tiles import TiledHeader, TileFormatError

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "FORMAT",
    "HeaderError",
    "ImageHeader",
    "JSON_MEMBER",
    "MANIFEST",
    "MemberAt",
    "MAX_NAMES",
    "Manifest",
    "ManifestError",
    "PatternError",
    "ShardInfo",
    "TILED",
    "TarFormatError",
    "TileFormatError",
    "TiledHeader",
    "check_pair",
    "check_shard_name",
    "count_braces",
    "expand_braces",
    "hr_member",
    "image_header",
    "iter_entries",
    "iter_members",
    "iter_samples",
    "kind_text",
    "load",
    "locate",
    "lr_member",
    "pair_fits",
    "parse",
    "probe_file",
    "shard_path",
    "split_name",
    "tiles",
]
