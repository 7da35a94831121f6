"""``wdsr train``, the reference DDP trainer: ``loop`` (the run), ``config`` (TrainConfig, its file and
flags), ``checkpoint`` (the run folder), ``models`` (EDSR-baseline, ESPCN), ``validate``."""

from wdsr.train.loop import train

__all__ = ["train"]
