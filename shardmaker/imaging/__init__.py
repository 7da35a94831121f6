"""Pixels: ``codecs`` (source images in, shard members out: PNG, QOI), ``png`` (our PNG writer and the
libdeflate + libspng reader) and ``resize`` (MATLAB-exact bicubic ``imresize``).

A public door of ``shardmaker``: ``wdsr`` uses the names below and nothing else from here."""

from shardmaker.imaging.codecs import Codec, ImageDataError, decode, encode, load_source
from shardmaker.imaging.resize import ResizeMethod, downscale, upscale

__all__ = ["Codec", "ImageDataError", "ResizeMethod", "decode", "downscale", "encode", "load_source", "upscale"]
