"""``wdsr train``, the reference DDP trainer: ``loop`` (the run), ``config`` (TrainConfig, its file and
flags), ``checkpoint`` (the run folder), ``models`` (EDSR-baseline, ESPCN, TinyVSR), ``upsample``
(the bicubic skip and ICNR that make them start at bicubic), ``validate``."""

from wdsr.train.loop import train

__all__ = ["train"]
