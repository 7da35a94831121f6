"""``wdsr train`` settings: one frozen dataclass, filled from a YAML/JSON file and then the flags.

Config file keys are the flag names (``patch-size`` or ``patch_size``; ``k`` for
``patches_per_image``); flags given on the command line override the file. What the train set
streams is a :class:`wdsr.DatasetConfig` (``cfg.dataset``): its options are set by the same flat
keys (``patch_size``, ``shuffle_buffer``, ``on_error``, ``decoded_cache_limit``, ...), or under a
``dataset:`` mapping in the file; sizes take units (``20GB``; a bare number is GB).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from pathlib import Path
from typing import Any

from shardmaker import compat
from shardmaker.clikit import parse_size
from wdsr.config import DatasetConfig
from wdsr.train.models import ModelName


class Amp(str, enum.Enum):
    AUTO = "auto"  # bf16 autocast on CUDA where supported, else fp16 + GradScaler; off on CPU
    BF16 = "bf16"
    FP16 = "fp16"
    OFF = "off"


class Schedule(str, enum.Enum):
    COSINE = "cosine"  # lr * (1 + cos(pi * step / steps)) / 2
    STEP = "step"  # lr * gamma ** (step // lr_step)


class Device(str, enum.Enum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


DEFAULT_STEPS = 100_000


def default_workers() -> int:
    """DataLoader workers per rank by default: the cores this process may use, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    data: str
    out: str
    dataset: DatasetConfig = dataclasses.field(default_factory=DatasetConfig)  # the train set's options
    val_data: str | None = None
    model: ModelName = ModelName.EDSR_BASELINE
    workers: int = dataclasses.field(default_factory=lambda: default_workers())  # the machine's cores, at most 8
    steps: int | None = None
    epochs: int | None = None
    lr: float = 2e-4
    schedule: Schedule = Schedule.COSINE
    lr_step: int = 200_000
    lr_gamma: float = 0.5
    amp: Amp = Amp.AUTO
    val_every: int = 1000
    val_tile: int | None = None
    log_every: int = 50
    ckpt_every: int = 1000
    keep_ckpts: int = 3
    resume: bool = False
    check: bool = False  # validate settings, data and --out, then stop (a pre-flight init container)
    tensorboard: bool = False
    log_dir: str | None = None
    device: Device = Device.AUTO

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name != "dataset":
                object.__setattr__(self, f.name, _coerce(f.name, f.type, getattr(self, f.name)))
        if not isinstance(self.dataset, DatasetConfig):
            raise TypeError(f"dataset must be a wdsr.DatasetConfig, got {type(self.dataset).__name__}")
        if self.steps is not None and self.epochs is not None:
            raise ValueError("give --steps or --epochs, not both")
        if self.steps is None and self.epochs is None:
            object.__setattr__(self, "steps", DEFAULT_STEPS)
        positive = ["log_every", "lr_step"]
        for name in positive + [n for n in ("steps", "epochs", "val_tile") if getattr(self, n) is not None]:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("workers", "val_every", "ckpt_every", "keep_ckpts"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.dataset.split.value != "train":
            raise ValueError("the train set's DatasetConfig must have split='train' (--val-data is the val set)")

    def __getattr__(self, name: str) -> Any:  # cfg.patch_size and the like: moved to cfg.dataset (0.2)
        if name in DATASET_KEYS:
            compat.warn(f"TrainConfig.{name}", f"TrainConfig.dataset.{name}")
            return getattr(self.dataset, name)
        raise AttributeError(f"'TrainConfig' object has no attribute {name!r}")

    @property
    def dict(self) -> dict[str, Any]:
        """JSON-able settings, flat (as stored in run.json and checkpoints): the train settings, then
        the train set's options under their own names."""
        out = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "dataset"}
        return {**out, **{name: _plain(getattr(self.dataset, name)) for name in DATASET_KEYS}}


# the DatasetConfig options a train config sets (the val set's tiles are val_tile; split is implied)
DATASET_KEYS = tuple(f.name for f in dataclasses.fields(DatasetConfig) if f.name not in ("split", "tile", "return_keys"))
_SIZES = ("cache_limit", "decoded_cache_limit")  # bytes, given with units (a bare number is GB)


def _check_flags(opts: dict[str, Any]) -> None:
    """The train set's numbers in the flags' own words, before DatasetConfig checks them its way."""
    defaults = DatasetConfig()
    get = {name: opts.get(name, getattr(defaults, name)) for name in ("scale", "patch_size", "patches_per_image", "batch_size")}
    for name, value in get.items():
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if opts.get("shuffle_buffer", 0) < 0:
        raise ValueError(f"--shuffle-buffer must be >= 0, got {opts['shuffle_buffer']}")
    if get["scale"] < 2:
        raise ValueError(f"--scale must be >= 2, got {get['scale']}")
    if get["patch_size"] % get["scale"]:
        raise ValueError(f"--patch-size {get['patch_size']} is not a multiple of --scale {get['scale']}")


def _plain(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    return dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v


def dataset_config(settings: dict[str, Any], where: str) -> DatasetConfig:
    """The train set's options from flat settings (already split from the train ones)."""
    opts: dict[str, Any] = {}
    types = {f.name: f.type for f in dataclasses.fields(DatasetConfig)}
    for name, value in settings.items():
        optional = "None" in str(types[name])
        if value is None and not optional:
            continue  # null for an option that cannot be None: the DatasetConfig default
        if name in _SIZES and value is not None:
            try:
                value = parse_size(value, unit="GB")
            except Exception as exc:  # argparse.ArgumentTypeError: one clear line
                raise ValueError(f"{where}: {name}: {exc}") from None
        elif name == "retry" and isinstance(value, dict):
            from wdsr.store.remote import Retry

            try:
                value = Retry(**value)
            except TypeError as exc:
                raise ValueError(f"{where}: retry: {exc}") from None
        elif str(types[name]).replace(" | None", "") in _TYPES:
            value = _coerce(name, types[name], value)
        opts[name] = value
    _check_flags(opts)
    try:
        return DatasetConfig(**opts)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from None


_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}


def _coerce(name: str, annotation: Any, value: Any) -> Any:
    """Check a value against the field's type; accept what a YAML/JSON file or argparse gives."""
    text = str(annotation)
    optional = "None" in text
    if value is None:
        if optional:
            return None
        raise ValueError(f"{name} must be set")
    base = text.replace(" | None", "").strip()
    for enum_type in (ModelName, Amp, Schedule, Device):
        if base == enum_type.__name__:
            try:
                return enum_type(value)
            except ValueError:
                choices = ", ".join(m.value for m in enum_type)
                raise ValueError(f"{name}: {value!r} is not one of {choices}") from None
    kind = _TYPES[base]
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"{name} must be a number, got {value!r}")
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {value!r}")
    return value


_ALIASES = {"k": "patches_per_image"}
_FLAGS_ONLY = {"resume", "check"}  # what to do with the run, not how to train it


def normalise_keys(d: dict[str, Any], where: str) -> dict[str, Any]:
    known = ({f.name for f in dataclasses.fields(TrainConfig)} | set(DATASET_KEYS)) - {"dataset"}
    nested = d.get("dataset")
    if isinstance(nested, dict):  # a ``dataset:`` mapping in a config file: the same keys, one level down
        d = {**{k: v for k, v in d.items() if k != "dataset"}, **nested}
    out = {}
    for key, value in d.items():
        name = _ALIASES.get(str(key), str(key).replace("-", "_"))
        if name not in known or name in _FLAGS_ONLY and where != "flags":
            raise ValueError(f"{where}: unknown setting {key!r} (known: {', '.join(sorted(known - _FLAGS_ONLY))})")
        out[name] = value
    return out


def load_file(path: str) -> dict[str, Any]:
    """Settings from a ``.yaml``/``.yml`` or ``.json`` file (a mapping of flag names to values)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ValueError(f"--config {path}: cannot read ({exc.strerror or exc})") from None
    try:
        if p.suffix.lower() == ".json":
            d = json.loads(text)
        else:
            import yaml

            d = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - any parse error becomes one clear line
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"--config {path}: not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'} ({first})") from None
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise ValueError(f"--config {path}: expected a mapping of setting names to values")
    return normalise_keys(d, f"--config {path}")


def make_config(flags: dict[str, Any]) -> TrainConfig:
    """The file named by ``flags['config']`` (if any), then the flags on top."""
    flags = dict(flags)
    path = flags.pop("config", None)
    merged = load_file(path) if path else {}
    merged.update(normalise_keys(flags, "flags"))
    for required in ("data", "out"):
        if not merged.get(required):
            raise ValueError(f"--{required} is required (on the command line or in --config)")
    data = {k: merged.pop(k) for k in list(merged) if k in DATASET_KEYS}
    return TrainConfig(**merged, dataset=dataset_config(data, "--config" if path else "flags"))
