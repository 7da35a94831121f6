"""Pixels: ``codecs`` (source images in, shard members out: PNG, QOI), ``png`` (our PNG writer and the
libdeflate + libspng reader), ``resize`` (MATLAB-exact bicubic ``imresize``; ``crop_lr``: the LR of
part of an image, bit-exact) and ``tiled`` (tiled members: an image cut into tiles, a region decoded
from the tiles it touches), ``regions`` (large TIFF sources read region by region).

A public door of ``shardmaker``: ``wdsr`` uses the names below and nothing else from here."""

from shardmaker.imaging.codecs import Codec, ImageDataError, decode, encode, image_size, load_source
from shardmaker.imaging.croplr import crop_lr
from shardmaker.imaging.regions import TiffRegions, is_tiff
from shardmaker.imaging.resize import ResizeMethod, downscale, upscale
from shardmaker.imaging.tiled import TiledImage, decode_region, encode_tiled, read_layout

__all__ = [
    "Codec",
    "ImageDataError",
    "ResizeMethod",
    "TiffRegions",
    "TiledImage",
    "crop_lr",
    "decode",
    "decode_region",
    "downscale",
    "encode",
    "encode_tiled",
    "image_size",
    "is_tiff",
    "load_source",
    "read_layout",
    "upscale",
]
