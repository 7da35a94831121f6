"""wdsr: stream aligned multi-patch super-resolution batches from wdsr-shards/1 tar shards.

ds = wdsr.SRDataset(url, scale=4, patch_size=192, patches_per_image=16, batch_size=16)
loader = wdsr.make_loader(ds, num_workers=8)    # len(loader) = batches per rank per epoch
for lr, hr in loader: sr = model(wdsr.to_float(lr.cuda()))
state = loader.state_dict(); loader.load_state_dict(state)   # exact mid-epoch resume
"""

from shardmaker import deprecation
from shardmaker.errors import OnError
from wdsr.config import DatasetConfig, Split
from wdsr.dataset import SRDataset, ValSample
from wdsr.degrade import ArbitraryScaleConfig, BSRGANConfig, Degrader, RealESRGANConfig
from wdsr.errors import SampleError
from wdsr.loader import SRLoader, make_loader, to_float
from wdsr.pipeline.clips import ClipConfig
from wdsr.pipeline.clipval import ValClip
from wdsr.pipeline.tiles import stitch
from wdsr.state import LoaderStateError, WorldChanged
from wdsr.store.remote import ReadFailed, Retry

__all__ = [
    "ArbitraryScaleConfig",
    "BSRGANConfig",
    "ClipConfig",
    "DatasetConfig",
    "Degrader",
    "LoaderStateError",
    "OnError",
    "ReadFailed",
    "RealESRGANConfig",
    "Retry",
    "SRDataset",
    "SRLoader",
    "SampleError",
    "Split",
    "ValClip",
    "ValSample",
    "WorldChanged",
    "make_loader",
    "stitch",
    "to_float",
]
__version__ = "0.1.0"

# module paths of the flat layout (before 0.2), served for one release with a warning
deprecation.alias_modules(
    {
        **{f"wdsr.{m}": f"wdsr.pipeline.{m}" for m in ("plan", "read", "decode", "patches", "augment", "shuffle", "stream")},
        **{f"wdsr.{m}": f"wdsr.pipeline.{m}" for m in ("handoff", "stats", "tiles")},
        **{f"wdsr.{m}": f"wdsr.store.{m}" for m in ("remote", "cache", "decoded", "urls")},
        **{f"wdsr.{m}": f"wdsr.train.{m}" for m in ("checkpoint", "models", "validate")},
        "wdsr.trainconfig": "wdsr.train.config",
        **{f"wdsr.{m}": f"wdsr.tools.{m}" for m in ("cli", "bench", "preview", "demo")},
    }
)
