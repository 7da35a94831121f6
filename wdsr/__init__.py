"""wdsr: stream super-resolution training patches from wdsr-shards/1 tar shards."""
__version__ = "0.1.0"
