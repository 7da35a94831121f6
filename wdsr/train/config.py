"""``wdsr train`` settings: one frozen dataclass, filled from a YAML/JSON file and then the flags.

Config file keys are the flag names (``patch-size`` or ``patch_size``; ``k`` for
``patches_per_image``); flags given on the command line override the file. What the train set
streams is a :class:`wdsr.DatasetConfig` (``cfg.dataset``): its options are set by the same flat
keys (``patch_size``, ``shuffle_buffer``, ``on_error``, ``decoded_cache_limit``, ...), or under a
``dataset:`` mapping in the file; sizes take units (``20GB``; a bare number is GB). Clip datasets are
streamed as windows of frames (``cfg.dataset.clip``, a :class:`wdsr.ClipConfig`) when ``clip_frames``
is set, with ``clip_interval``, ``clip_window`` and ``clip_reverse`` (:data:`CLIP_KEYS`). Every value is
checked once, here (type and range, flags and files alike); a setting given twice in one file (two
spellings, or at the top and under ``dataset:``) is an error naming both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from shardmaker import deprecation, storage
from shardmaker.commandline import parse_size
from shardmaker.errors import brief
from wdsr.bounds import Bound, bounded, bounds, check_multiple, check_number, default_of
from wdsr.config import LIMITS, MAX_PATH_CHARS, DatasetConfig
from wdsr.degrade import draw_arrays, registry
from wdsr.pipeline.clips import ClipConfig
from wdsr.store.remote import Retry
from wdsr.train.checkpoint import FORMAT, RunDir
from wdsr.train.models import ModelName
from wdsr.train.zoo import PREFIX, ZooError, ZooModel, check_buildable, lookup, parse_args
from wdsr.train.zooload import load_file as load_model_file

log = logging.getLogger("wdsr")


class ConfigError(ValueError):
    """A train setting, config file or flag that cannot be used; the CLI prints it as one line, exit 2."""


class Amp(str, enum.Enum):
    AUTO = "auto"  # bf16 autocast on CUDA where supported, else fp16 + GradScaler; off on CPU
    BF16 = "bf16"
    FP16 = "fp16"
    OFF = "off"


class Schedule(str, enum.Enum):
    COSINE = "cosine"  # lr * (1 + cos(pi * step / steps)) / 2
    STEP = "step"  # lr * gamma ** (step // lr_step)


class ClipWindow(str, enum.Enum):
    RECURRENT = "recurrent"  # T frames in, T out (BasicVSR)
    CENTER = "center"  # T frames in (T odd), the centre one out (EDVR)


class Device(str, enum.Enum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


DEFAULT_STEPS = 100_000
BIG = 10**12  # steps and step counts: far beyond any run, far below int64


def default_workers() -> int:
    """DataLoader workers per rank by default: the cores this process may use, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The settings of a run. Each number's range is on its field (``wdsr.bounds``; the train set's own are
    ``wdsr.config.LIMITS``): the lr and gamma are finite and can neither train to inf nor grow the rate;
    workers are bounded by what any node could use."""

    data: str
    out: str
    dataset: DatasetConfig = dataclasses.field(default_factory=DatasetConfig)  # the train set's options
    val_data: str | None = None
    model: ModelName | ZooModel = ModelName.EDSR_BASELINE  # or spandrel:NAME (wdsr.train.zoo)
    model_args: dict[str, Any] | None = None  # a spandrel architecture's options beyond its defaults
    init: str | None = None  # a spandrel-loadable model file to start from (its architecture and scale)
    # the machine's cores, at most 8
    workers: int = bounded(default_factory=lambda: default_workers(), lo=0, hi=256, integer=True)
    steps: int | None = bounded(None, 1, BIG, integer=True)  # None (and no epochs): DEFAULT_STEPS
    epochs: int | None = bounded(None, 1, 10**6, integer=True)
    lr: float = bounded(2e-4, 0.0, 1.0, lo_open=True)
    schedule: Schedule = Schedule.COSINE
    lr_step: int = bounded(200_000, 1, BIG)
    lr_gamma: float = bounded(0.5, 0.0, 1.0, lo_open=True)
    amp: Amp = Amp.AUTO
    val_every: int = bounded(1000, 0, BIG)
    val_tile: int | None = bounded(None, 1, 1 << 20, integer=True)
    log_every: int = bounded(50, 1, BIG)
    ckpt_every: int = bounded(1000, 0, BIG)
    ckpt_minutes: float | None = bounded(None, 0.0, 10**6, integer=False)  # also every M minutes (rank 0's clock); 0/None: off
    keep_ckpts: int = bounded(3, 0, 10**6)
    resume: bool = False
    check: bool = False  # validate settings, data and --out, then stop (a pre-flight init container)
    tensorboard: bool = False
    log_dir: str | None = None
    device: Device = Device.AUTO

    def __post_init__(self) -> None:
        with _as_config_error():
            object.__setattr__(self, "model", _model(self.model))
            object.__setattr__(self, "model_args", parse_args(self.model_args) or None)
        for f in dataclasses.fields(self):
            if f.name not in ("dataset", "model", "model_args"):
                object.__setattr__(self, f.name, _coerce(f.name, f.type, getattr(self, f.name)))
        if not isinstance(self.dataset, DatasetConfig):
            raise ConfigError(f"dataset must be a wdsr.DatasetConfig, got {type(self.dataset).__name__}")
        if self.steps is not None and self.epochs is not None:
            raise ConfigError("give --steps or --epochs, not both")
        if self.steps is None and self.epochs is None:
            object.__setattr__(self, "steps", DEFAULT_STEPS)
        if self.dataset.split.value != "train":
            raise ConfigError("the train set's DatasetConfig must have split='train' (--val-data is the val set)")
        _check_clip_model(self)
        with _as_config_error():
            _check_zoo(self)

    def __getattr__(self, name: str) -> Any:  # cfg.patch_size and the like: moved to cfg.dataset (0.2)
        if name in DATASET_KEYS:
            deprecation.warn(f"TrainConfig.{name}", f"TrainConfig.dataset.{name}")
            return getattr(self.dataset, name)
        raise AttributeError(f"'TrainConfig' object has no attribute {name!r}")

    @property
    def dict(self) -> dict[str, Any]:
        """JSON-able settings, flat (as stored in run.json and checkpoints): the train settings, then
        the train set's options under their own names."""
        out = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "dataset"}
        clip = self.dataset.clip
        clips = {key: None if clip is None else _plain(getattr(clip, field)) for key, field in CLIP_KEYS.items()}
        clips["clip_interval"] = None if clip is None else list(clip.interval)
        degrade = registry.name_of(self.dataset.degrade)
        return {**out, **{name: _plain(getattr(self.dataset, name)) for name in DATASET_KEYS}, **clips, "degrade": degrade}


def _model(value: Any) -> ModelName | ZooModel:
    """``--model``: a built-in name, or ``spandrel:NAME`` (an SR architecture spandrel builds)."""
    if isinstance(value, (ModelName, ZooModel)):
        return value
    if isinstance(value, str) and value.startswith(PREFIX):
        model = ZooModel(value[len(PREFIX) :])
        lookup(model.arch)
        return model
    if isinstance(value, str) and value in {m.value for m in ModelName}:
        return ModelName(value)
    known = ", ".join(m.value for m in ModelName)
    raise ConfigError(f"--model: {brief(value)} is not one of {known}, or spandrel:NAME (docs/models.md)")


@contextlib.contextmanager
def _as_config_error() -> Iterator[None]:
    """A spandrel model's error (``wdsr.train.zoo.ZooError``) as a ConfigError: the same one line, exit 2."""
    try:
        yield
    except ZooError as exc:
        raise ConfigError(str(exc)) from None


def _check_zoo(cfg: TrainConfig) -> None:
    """--model-args and --init go with a spandrel model; its options build it (on the meta device)."""
    if not isinstance(cfg.model, ZooModel):
        for name, value in (("model_args", cfg.model_args), ("init", cfg.init)):
            if value:
                raise ConfigError(
                    f"{flag(name)} is for spandrel models (--model spandrel:NAME); --model {cfg.model.value} is built in"
                )
        return
    if cfg.init and cfg.model_args:
        raise ConfigError("--model-args: --init takes the architecture and its options from the file")
    if not cfg.init:
        check_buildable(cfg.model, cfg.dataset.scale, 3, cfg.model_args or {})


def _check_clip_model(cfg: TrainConfig) -> None:
    """A video model trains on clips (windows of frames), an image model on patches; clips validate whole
    frames (``wdsr.train.clipvalidate``), not tiles."""
    clip = cfg.dataset.clip
    if cfg.model.video and clip is None:
        raise ConfigError(
            f"--model {cfg.model.value} is a video model: it trains on clip datasets (shardmaker build --clips); "
            "give --clip-frames T"
        )
    if clip is not None and not cfg.model.video:
        video = ", ".join(m.value for m in ModelName if m.video)
        raise ConfigError(
            f"--clip-frames streams windows of frames from clip datasets; --model {cfg.model.value} is an image model "
            f"(video models: {video})"
        )
    if clip is not None and cfg.val_data and cfg.val_every and cfg.val_tile is not None:
        raise ConfigError("--val-tile cuts val images into tiles; clips are validated whole frames: leave --val-tile unset")


# the DatasetConfig options a train config sets (the val set's tiles are val_tile; split is implied)
# (the clip is set by the CLIP_KEYS)
DATASET_KEYS = tuple(
    f.name for f in dataclasses.fields(DatasetConfig) if f.name not in ("split", "tile", "return_keys", "clip", "lr", "degrade")
)  # "lr" is the learning rate here; SRDataset(lr="bicubic") is not a train setting yet
# the train set's windows of frames (clip datasets): setting -> wdsr.ClipConfig field; on when clip_frames is set
CLIP_KEYS = {"clip_frames": "frames", "clip_interval": "interval", "clip_window": "window", "clip_reverse": "reverse"}
_CLIP_TYPES = {"clip_frames": "int", "clip_interval": "int", "clip_window": "ClipWindow", "clip_reverse": "float"}
TRAIN_SET_KEYS = (*DATASET_KEYS, *CLIP_KEYS, "degrade")  # the settings of the train set: flat, or under ``dataset:``
_SIZES = ("cache_limit", "decoded_cache_limit")  # bytes, given with units (a bare number is GB)
# what a train setting's number must be: the range on its dataclass field (TrainConfig, wdsr.ClipConfig;
# clip_interval: each interval of the list), else the train set's wdsr.config.LIMITS
_CLIP_BOUNDS = {
    key: dataclasses.replace(bounds(ClipConfig)[field], items=None)
    for key, field in CLIP_KEYS.items()
    if field in bounds(ClipConfig)
}
MAX_INTERVALS = bounds(ClipConfig)["interval"].items or 1  # intervals a window may draw from


def bound(name: str) -> Bound:
    """The range of the train setting ``name`` (the dataclass field's own)."""
    if name in bounds(TrainConfig):
        return bounds(TrainConfig)[name]
    if name in _CLIP_BOUNDS:
        return _CLIP_BOUNDS[name]
    lo, hi = LIMITS.get(name, (-BIG, BIG))
    return Bound(lo, hi, integer=True)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_flags(opts: dict[str, Any]) -> None:
    """What the train set needs beyond DatasetConfig's rules (each number is in range by now: ``_coerce``)."""
    defaults = DatasetConfig()
    get = {name: opts.get(name, getattr(defaults, name)) for name in ("scale", "patch_size")}
    if get["scale"] < 2:
        raise ConfigError(f"--scale must be >= 2, got {get['scale']}")
    try:
        check_multiple(get["patch_size"], get["scale"], "--patch-size", "--scale")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _plain(v: Any) -> Any:
    if isinstance(v, (enum.Enum, ZooModel)):
        return v.value
    return dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v


def _retry(value: Any, where: str) -> Any:
    """A ``retry:`` mapping (attempts, backoff_s, max_backoff_s, timeout_s), each field checked by
    ``wdsr.Retry`` itself (its fields' ranges)."""
    fields = [f.name for f in dataclasses.fields(Retry)]
    if isinstance(value, Retry):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: retry must be a mapping of {', '.join(fields)}, got {brief(value)}")
    for key in value:
        if key not in fields:
            raise ConfigError(f"{where}: retry: unknown field {brief(key)} (known: {', '.join(fields)})")
    try:
        return Retry(**value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _intervals(value: Any) -> tuple[int, ...]:
    """``--clip-interval``: ``2``, ``"1,2"`` or ``[1, 2]``; each interval checked."""
    if isinstance(value, str):
        if len(value) > 8 * MAX_INTERVALS:
            raise ConfigError(f"--clip-interval must be at most {MAX_INTERVALS} integers, got {brief(value)}")
        parts: list[Any] = [part.strip() for part in value.split(",")]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = [value]
    if not 1 <= len(parts) <= MAX_INTERVALS:
        raise ConfigError(f"--clip-interval must be 1 to {MAX_INTERVALS} integers (1,2,...), got {brief(value)}")
    return tuple(_coerce("clip_interval", "int", part) for part in parts)


def clip_config(settings: dict[str, Any], where: str) -> ClipConfig | None:
    """The train set's windows (``CLIP_KEYS`` settings, null = unset), or None (an image dataset)."""
    given = {key: value for key, value in settings.items() if value is not None}
    if not given:
        return None
    if "clip_frames" not in given:
        raise ConfigError(
            f"{', '.join(flag(k) for k in given)} without --clip-frames: give --clip-frames T (windows of T frames)"
        )
    fields: dict[str, Any] = {}
    for key, value in given.items():
        checked = _intervals(value) if key == "clip_interval" else _coerce(key, _CLIP_TYPES[key], value)
        fields[CLIP_KEYS[key]] = checked.value if isinstance(checked, enum.Enum) else checked
    try:
        return ClipConfig(**fields)
    except ValueError as exc:  # a center window of an even number of frames
        raise ConfigError(f"{'' if where == 'flags' else where + ': '}{exc} (--clip-frames, --clip-window)") from None


def degrade_config(name: Any, scale: int, patch_size: int, where: str, fixed_scale: bool = True) -> Any:
    """``--degrade NAME`` (``wdsr.degrade.registry``): the model's defaults (Real-ESRGAN's
    train_realesrnet_x4plus.yml, BSRGAN's degradation_bsrgan, ...) at the run's scale and HR patch size;
    null: none. ``fixed_scale``: refuse a model whose LR is not HR / scale (``wdsr train``'s models upscale
    by one integer scale; ``wdsr preview`` shows any)."""
    if name is None:
        return None
    label = f"{'' if where == 'flags' else where + ': '}--degrade"
    try:
        model = registry.lookup(name, label)
        if fixed_scale:
            registry.check_fixed_scale(model, label, "wdsr train")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        cfg = registry.make(name, scale, patch_size, label)
        draw_arrays(cfg, np.random.default_rng(0), patch_size)  # a patch too small for its kernels
    except ValueError as exc:
        raise ConfigError(f"{label} {name} (--patch-size {patch_size}): {exc}") from None
    return cfg


def degrade_patch(name: Any, scale: int) -> int | None:
    """``--degrade NAME`` without ``--patch-size``: the model's own HR patch side (its config's ``gt_size``,
    Real-ESRNet's yml: 256), rounded down to a multiple of ``scale``; None for an unknown name
    (``degrade_config`` says what is known)."""
    if not isinstance(name, str) or name not in registry.DEGRADATIONS:
        return None
    gt = default_of(registry.DEGRADATIONS[name].config, "gt_size")
    return max(scale, gt // scale * scale) if isinstance(scale, int) and scale > 0 else gt


def dataset_config(settings: dict[str, Any], where: str) -> DatasetConfig:
    """The train set's options from flat settings (already split from the train ones)."""
    opts: dict[str, Any] = {"clip": clip_config({k: v for k, v in settings.items() if k in CLIP_KEYS}, where)}
    degrade = settings.get("degrade")
    settings = {k: v for k, v in settings.items() if k not in CLIP_KEYS and k != "degrade"}
    types = {f.name: f.type for f in dataclasses.fields(DatasetConfig)}
    for name, value in settings.items():
        optional = "None" in str(types[name])
        if value is None and not optional:
            continue  # null for an option that cannot be None: the DatasetConfig default
        if name in _SIZES and value is not None:
            label = flag(name) if where == "flags" else f"{where}: {name}"
            if isinstance(value, str) and len(value) > 40 or not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ConfigError(f"{label}: not a size: {brief(value)} (examples: 20GB, 500MiB)")
            if not isinstance(value, str) and not 0 <= value <= 1 << 40:  # no huge int reaches parse_size's message
                raise ConfigError(f"{label}: not a size under 1 TiB: {brief(value)}")
            try:
                value = parse_size(value, unit="GB")
            except Exception as exc:  # argparse.ArgumentTypeError: one clear line
                raise ConfigError(f"{label}: {exc}") from None
            if value == 0:
                raise ConfigError(f"{label} is 0 bytes: give a size, or leave it unset (null) for no limit")
        elif name == "retry":
            value = _retry(value, where)
        elif str(types[name]).replace(" | None", "") in _TYPES:
            value = _coerce(name, types[name], value)
        opts[name] = value  # the enums: DatasetConfig checks their names
    patch = degrade_patch(degrade, opts.get("scale", DatasetConfig().scale)) if "patch_size" not in opts else None
    if patch is not None:
        log.info("--degrade %s: --patch-size %d (the model's own; give --patch-size to change it)", degrade, patch)
        opts["patch_size"] = patch
    _check_flags(opts)
    defaults = DatasetConfig()
    scale, patch = opts.get("scale", defaults.scale), opts.get("patch_size", defaults.patch_size)
    opts["degrade"] = degrade_config(degrade, scale, patch, where)
    try:
        return DatasetConfig(**opts)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}
_ENUMS = {e.__name__: e for e in (ModelName, Amp, Schedule, Device, ClipWindow)}


def _coerce(name: str, annotation: Any, value: Any) -> Any:
    """Check a value against the field's type and range; accept what a YAML/JSON file or argparse gives."""
    text = str(annotation)
    optional = "None" in text
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{flag(name)} must be set")
    base = text.replace(" | None", "").strip()
    if base in _ENUMS:
        enum_type = _ENUMS[base]
        if isinstance(value, str) and len(value) <= 64 and value in {m.value for m in enum_type}:
            return enum_type(value)
        raise ConfigError(f"{flag(name)}: {brief(value)} is not one of {', '.join(m.value for m in enum_type)}")
    kind = _TYPES[base]
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{flag(name)} must be true or false, got {brief(value)}")
    if kind in (int, float):
        if isinstance(value, str):  # a number written as text ("2e-4": YAML 1.1 reads it as a string)
            value = _parse_number(name, value, kind)
        b = bound(name)
        try:
            return check_number(flag(name), value, b.lo, b.hi, kind is int, b.lo_open)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if not isinstance(value, str) or len(value) > MAX_PATH_CHARS:
        raise ConfigError(f"{flag(name)} must be a string of at most {MAX_PATH_CHARS} characters, got {brief(value)}")
    return value


def _parse_number(name: str, text: str, kind: type) -> Any:
    try:
        if len(text) > 40:
            raise ValueError
        return int(text) if kind is int else float(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"{flag(name)} must be {what}, got {brief(text)}") from None


_ALIASES = {"k": "patches_per_image"}
_FLAGS_ONLY = {"resume", "check"}  # what to do with the run, not how to train it


MAX_CONFIG_BYTES = 1 << 20  # a config file is a page of settings; anything larger is refused unread
MAX_ITEMS = 10_000  # values in a config once YAML aliases are expanded (a "billion laughs" is refused)


def _expanded_items(value: Any, where: str) -> None:
    """Count what walking ``value`` would visit (aliases count each time they are used); refuse a
    value larger than ``MAX_ITEMS`` before anything repr()s, copies or iterates it."""
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > MAX_ITEMS:
            raise ConfigError(f"{where}: more than {MAX_ITEMS} values once YAML aliases are expanded; refused")
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def normalise_keys(d: dict[str, Any], where: str) -> dict[str, Any]:
    """Flag names (``patch-size``, ``patch_size``, ``k``; a ``dataset:`` mapping one level down) -> field
    names; an unknown name, or one setting given under two names, is an error naming them."""
    known = ({f.name for f in dataclasses.fields(TrainConfig)} | set(TRAIN_SET_KEYS)) - {"dataset"}
    d = _model_mapping(d, where)
    items = [(key, value, "") for key, value in d.items() if key != "dataset"]
    if "dataset" in d:  # a ``dataset:`` mapping in a config file: the train set's options, one level down
        if not isinstance(d["dataset"], dict):
            raise ConfigError(f"{where}: dataset must be a mapping of the train set's options, got {brief(d['dataset'])}")
        items += [(key, value, "dataset.") for key, value in d["dataset"].items()]
    out: dict[str, Any] = {}
    given: dict[str, str] = {}  # field name -> how it was spelled
    for key, value, prefix in items:
        if not isinstance(key, str) or len(key) > 64:
            raise ConfigError(f"{where}: a setting name must be a short string, got {brief(key)}")
        name = _ALIASES.get(key, key.replace("-", "_"))
        if name not in known or name in _FLAGS_ONLY and where != "flags" or prefix and name not in TRAIN_SET_KEYS:
            choices = sorted(set(TRAIN_SET_KEYS) if prefix else known - _FLAGS_ONLY)
            raise ConfigError(f"{where}: unknown setting {brief(prefix + key)} (known: {', '.join(choices)})")
        if name in given:
            raise ConfigError(f"{where}: {given[name]!r} and {prefix + key!r} both set {name}; give it once")
        given[name] = prefix + key
        out[name] = value
    return out


def _model_mapping(d: dict[str, Any], where: str) -> dict[str, Any]:
    """A config file's ``model: {name: spandrel:SPAN, feature_channels: 32}``: ``model`` and ``model_args``."""
    if not isinstance(d.get("model"), dict):
        return d
    options = dict(d["model"])
    if "name" not in options:
        raise ConfigError(f"{where}: a model mapping needs name: (e.g. name: spandrel:SPAN), then the options")
    if any(k in d for k in ("model_args", "model-args")):
        raise ConfigError(f"{where}: give a spandrel model's options under model: or as model_args, not both")
    name = options.pop("name")
    return {**d, "model": name, "model_args": options}


def _strict_yaml() -> Any:
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently)."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[str] = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    if key_node.value in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"{brief(key_node.value)} is given twice", key_node.start_mark
                        )
                    seen.add(key_node.value)
            return super().construct_mapping(node, deep=deep)

    return Loader


def _no_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{brief(key)} is given twice")
        out[key] = value
    return out


def load_file(path: str) -> dict[str, Any]:
    """Settings from a ``.yaml``/``.yml`` or ``.json`` file (a mapping of flag names to values), at most
    ``MAX_CONFIG_BYTES``; a regular file only (a FIFO would block the read)."""
    label = f"--config {brief(path) if len(path) > MAX_PATH_CHARS else path}"
    try:
        with storage.open_regular(path) as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:  # InputError: a FIFO, a device, a folder
        raise ConfigError(f"--config {exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{label}: over {MAX_CONFIG_BYTES >> 20} MiB; a config file is a page of settings")
    json_file = path.lower().endswith(".json")
    try:
        if json_file:
            d = json.loads(data, object_pairs_hook=_no_twice)
        else:
            import yaml

            d = yaml.load(data, Loader=_strict_yaml())  # noqa: S506 - a SafeLoader subclass
    except Exception as exc:  # noqa: BLE001 - any parse error becomes one clear line
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ConfigError(f"{label}: not valid {'JSON' if json_file else 'YAML'} ({first})") from None
    if d is None:
        return {}
    _expanded_items(d, label)
    if not isinstance(d, dict):
        raise ConfigError(f"{label}: expected a mapping of setting names to values, got {brief(d)}")
    return normalise_keys(d, label)


def saved_settings(out: Any) -> dict[str, Any]:
    """``OUT/run.json``'s settings (those of the run's latest start) by field name, without ``out`` and the
    flags-only ones: what ``--resume`` starts from, under ``--config`` and the flags. {} when there is none;
    names this version does not know (another version's run.json) are left out, logged."""
    if not isinstance(out, str) or not out:
        return {}
    info = RunDir(out).run_info()
    if info is None:
        return {}
    saved = info.get("config")
    if info.get("format") != FORMAT or not isinstance(saved, dict):
        raise ConfigError(f"{out}/run.json: not a {FORMAT} run (its 'format' or 'config' is missing or wrong)")
    known = ({f.name for f in dataclasses.fields(TrainConfig)} | set(TRAIN_SET_KEYS)) - {"dataset", "out", *_FLAGS_ONLY}
    # "residual" is the model's variant, recorded beside the settings: a resume takes it from the checkpoint
    unknown = [k for k in saved if k not in known and k not in ("out", "residual", "spandrel", *_FLAGS_ONLY)]
    if unknown:
        log.warning("%s/run.json: settings this version does not know are left out: %s", out, brief(unknown))
    return normalise_keys({k: v for k, v in saved.items() if k in known}, f"{out}/run.json")


def _as_given(name: str, value: Any) -> Any:
    """A value of run.json as a flag would give it: sizes are saved in bytes (a bare number given is GB)."""
    return f"{value}b" if name in _SIZES and isinstance(value, int) and not isinstance(value, bool) else value


def _log_overrides(cfg: TrainConfig, saved: dict[str, Any]) -> None:
    """One line per setting of run.json that this start changes (``--config`` or a flag): name, saved, new."""
    if os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 says it once
        return
    now = cfg.dict
    for name, old in saved.items():
        if now.get(name) == old:
            continue
        note = ""
        if name in ("steps", "epochs") and now.get(name) is not None and cfg.schedule is Schedule.COSINE:
            note = " (the cosine LR schedule is re-stretched over the new total from the step reached)"
        log.warning("--resume: %s was %s in %s/run.json, now %s%s", flag(name), brief(old), cfg.out, brief(now.get(name)), note)


def _from_init(merged: dict[str, Any]) -> None:
    """``--init FILE``: ``model`` and ``scale`` from the file (spandrel's detection); one given that disagrees
    is an error."""
    path = merged["init"]
    if not isinstance(path, str) or len(path) > MAX_PATH_CHARS:
        raise ConfigError(f"--init must be a model file name, got {brief(path)}")
    try:
        desc = load_model_file(path)
    except ValueError as exc:  # ZooError, InputError (a folder, a FIFO)
        raise ConfigError(str(exc) if str(exc).startswith(path) else f"--init {exc}") from None
    model, scale = PREFIX + desc.architecture.id, desc.scale
    given = merged.get("model")
    with _as_config_error():  # a class name (spandrel:RRDBNet) names its architecture (ESRGAN)
        same = isinstance(given, str) and given.startswith(PREFIX) and lookup(given[len(PREFIX) :])[0] == model[len(PREFIX) :]
    if given is not None and not same:
        raise ConfigError(f"--init {path}: a {model} model; --model {brief(_plain(given))} disagrees (leave --model out)")
    if merged.get("scale") is not None and merged["scale"] != scale:
        raise ConfigError(f"--init {path}: a x{scale} model; --scale {brief(merged['scale'])} disagrees (leave --scale out)")
    merged["model"], merged["scale"] = model, scale


def make_config(flags: dict[str, Any]) -> TrainConfig:
    """The file named by ``flags['config']`` (if any), then the flags on top; with ``resume``, both on top of
    the settings in ``OUT/run.json`` (each change logged), so ``--out RUN --resume`` is enough."""
    flags = dict(flags)
    path = flags.pop("config", None)
    if path is not None and not isinstance(path, str):
        raise ConfigError(f"--config must be a file name, got {brief(path)}")
    merged = load_file(path) if path else {}
    _expanded_items(flags, "flags")
    merged.update(normalise_keys(flags, "flags"))
    saved = saved_settings(merged.get("out")) if merged.get("resume") else {}
    length = ("steps", "epochs") if "steps" in merged or "epochs" in merged else ()  # given now: replaces the saved
    merged = {**{k: _as_given(k, v) for k, v in saved.items() if k not in length}, **merged}
    for required in ("data", "out"):
        if not merged.get(required):
            raise ConfigError(f"--{required} is required (on the command line, in --config, or in OUT/run.json with --resume)")
    if merged.get("init") and not saved:  # a new run: the file names the architecture and the scale
        _from_init(merged)
    data = {k: merged.pop(k) for k in list(merged) if k in TRAIN_SET_KEYS}
    try:
        cfg = TrainConfig(**merged, dataset=dataset_config(data, "--config" if path else "flags"))
    except TypeError as exc:  # a TrainConfig field given a value of no use (cannot happen through the names above)
        raise ConfigError(f"settings: {exc}") from None
    _log_overrides(cfg, saved)
    return cfg
