"""BasicSR's own ``train_pipeline`` (its models, archs, losses, validation, logging, checkpoints) with
the train set streamed by wdsr: ``python -m wdsr.integrations.basicsr -opt train.yml [--launcher
pytorch] [--auto_resume]`` and ``datasets.train.type: WdsrDataset`` in the YAML (docs/integrations.md).

What changes in BasicSR's run, and why (each a wrapper installed by :func:`install`):
- ``build_dataset`` / ``build_dataloader``: the train loader is a ``wdsr.SRLoader`` (batches made in
  its workers, no sampler, no re-collation), seen by BasicSR as ``{'lq', 'gt'}`` uint8 batches;
- the model's ``feed_data`` converts them to float [0, 1] after BasicSR moved them to the device; with
  ``degrade`` (``realesrgan``, ``bsrgan`` or a mapping of the config's fields) the batches are uint8 HR
  plus per-patch parameters and ``feed_data`` makes ``lq`` from them with ``wdsr.Degrader`` first;
- the model's ``save`` writes the loader state beside each ``training_states/{iter}.state``
  (as ``{iter}.wdsr.json``), and ``load_resume_state`` restores it: a resumed run continues at the
  exact batch (BasicSR alone restarts the epoch); it loads on the CPU when ``num_gpu`` is 0;
- ``init_dist`` / ``model_to_device``: gloo and CPU DDP where there is no CUDA (BasicSR hard-codes nccl).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

import wdsr
from shardmaker import storage
from shardmaker.exitcodes import ExitCode
from wdsr.bounds import check_number
from wdsr.degrade import registry
from wdsr.loader import SRLoader

log = logging.getLogger("wdsr")

TYPE = "WdsrDataset"
RENAMED = {"dataroot": "url", "gt_size": "patch_size", "batch_size_per_gpu": "batch_size"}  # BasicSR's name -> ours
LOADER = {"num_worker_per_gpu": "num_workers", "pin_memory": "pin_memory", "prefetch_factor": "prefetch_factor"}
IGNORED = ("name", "type", "phase", "use_shuffle", "prefetch_mode")  # BasicSR's bookkeeping; wdsr always shuffles
MAX_SEED = 2**31 - 1  # BasicSR seeds numpy with manual_seed + rank, and numpy takes seeds below 2**32
STATE_SUFFIX = ".wdsr.json"  # not ".state": BasicSR's auto_resume takes every "*state" file for an iteration number


def dataset_options(opt: Mapping[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A BasicSR ``datasets.train`` mapping -> (URL, ``SRDataset`` options, ``make_loader`` options).

    BasicSR's names where they exist, then any ``SRDataset`` option by its own name (``degrade``,
    ``clip`` and other options land there as they are added to wdsr). Options that would change
    what BasicSR means by them are refused, not ignored."""
    if opt.get("prefetch_mode") not in (None, "cpu"):
        raise ValueError(f"prefetch_mode: {opt['prefetch_mode']!r}: wdsr's workers prefetch already; leave it unset or 'cpu'")
    if opt.get("dataset_enlarge_ratio", 1) != 1:
        raise ValueError("dataset_enlarge_ratio: with WdsrDataset, set patches_per_image (patches cut per image per epoch)")
    hflip, rot = bool(opt.get("use_hflip", True)), bool(opt.get("use_rot", True))
    if hflip != rot:
        raise ValueError("use_hflip and use_rot: wdsr draws one of the 8 dihedral transforms (both true) or none (both false)")
    if "dataroot" not in opt:
        raise ValueError(f"datasets.train.dataroot: the wdsr dataset URL is missing (type {TYPE})")
    options: dict[str, Any] = {"augment": hflip}
    loader: dict[str, Any] = {}
    for key, value in opt.items():
        if key in IGNORED or key in ("use_hflip", "use_rot", "dataset_enlarge_ratio"):
            continue
        if key in LOADER:
            loader[LOADER[key]] = value
        else:
            options[RENAMED.get(key, key)] = value
    url = options.pop("url")
    if options.get("degrade") is not None:
        options["degrade"] = degrade_option(options["degrade"], options.get("scale", 4), options.get("patch_size", 192))
    return url, options, loader


def degrade_option(value: Any, scale: int, gt_size: int) -> Any:
    """``degrade: NAME`` (a model of ``wdsr.degrade.registry``: ``realesrgan``, ``bsrgan``, ``arbitrary``), or
    a mapping ``{type: NAME, <fields>}`` whose fields are the config's (``wdsr.RealESRGANConfig`` keeps
    Real-ESRGAN's YAML names: ``blur_kernel_size``, ``kernel_list``, ``resize_range``, ``noise_range2``, ...),
    at the run's ``scale`` and ``gt_size``."""
    label = "datasets.train.degrade"
    fields = dict(value) if isinstance(value, Mapping) else {"type": value}
    name = fields.pop("type", None)
    model = registry.lookup(name, label)
    if model.float_scale is not None and scale != 1:
        raise ValueError(
            f"{label}: {name} {model.float_scale}: give the top-level `scale: 1` (got {scale}); "
            "HR patches are then cut on the HR grid"
        )
    if name == "realesrgan" and "blur_kernel_size2" in fields:  # Real-ESRGAN's yml names both rounds' size
        second = fields.pop("blur_kernel_size2")
        if second != fields.get("blur_kernel_size", 21):
            raise ValueError(
                f"{label}: blur_kernel_size2 {second!r} differs from blur_kernel_size: wdsr pads every "
                "kernel to one size (blur_kernel_size)"
            )
    if "queue_size" in fields:
        raise ValueError(
            f"{label}: queue_size: wdsr keeps no training-pair pool (parameters are drawn per patch and the "
            "shuffle buffer mixes the batches); leave it out"
        )
    lists = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}  # YAML lists -> the config's tuples
    try:
        return registry.make(name, scale, gt_size, label, **lists)
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc) if str(exc).startswith(label) else f"{label}: {exc}") from None


class WdsrDataset:
    """BasicSR's view of a wdsr train set: ``len()`` makes BasicSR's iterations per epoch
    (``ceil(len / (batch_size_per_gpu * world_size))``) equal ``len(loader)``; :meth:`loader` is the train loader."""

    def __init__(self, opt: Mapping[str, Any]) -> None:
        self.opt = dict(opt)
        url, options, self.loader_options = dataset_options(opt)
        self.dataset = wdsr.SRDataset(url, **options)
        self._loader: SRLoader | None = None

    def loader(self) -> SRLoader:
        if self._loader is None:
            self._loader = wdsr.make_loader(self.dataset, **self.loader_options)
        return self._loader

    def __len__(self) -> int:
        return len(self.loader()) * self.dataset.config.batch_size * self.dataset.world.size


class BasicsrBatches:
    """The loader as BasicSR's prefetcher reads it: ``{'lq', 'gt'}`` uint8 batches, and a pass starts
    at the first ``next()``: ``CPUPrefetcher`` calls ``iter()`` in its constructor and again at each
    epoch, and a wdsr pass started but never read would still count as an epoch."""

    def __init__(self, loader: SRLoader) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        degrade = self.loader.sr_dataset.config.degrade is not None
        for batch in self.loader:
            # degrade=: uint8 HR and its parameters; the model's feed_data makes the LR on its device
            yield {"gt": batch[0], "degrade": batch[1]} if degrade else {"lq": batch[0], "gt": batch[1]}


class Session:
    """One BasicSR run: the wrappers :func:`install` puts in place, and the loader state they pass on."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed  # the wdsr shuffle/patch seed when the dataset options have none: same on every rank
        self.pending: dict[str, Any] | None = None  # a loader state read with the resume state
        self.loader: SRLoader | None = None

    def build_dataset(self, original: Callable[..., Any], dataset_opt: dict[str, Any]) -> Any:
        if dataset_opt.get("type") == TYPE:
            dataset_opt = {"seed": self.seed, **dataset_opt}
        return original(dataset_opt)

    def build_dataloader(self, original: Callable[..., Any], dataset: Any, dataset_opt: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(dataset, WdsrDataset):
            return original(dataset, dataset_opt, *args, **kwargs)
        self.loader = loader = dataset.loader()
        if self.pending is not None:
            loader.load_state_dict(self.pending)
            self.pending = None
        return BasicsrBatches(loader)

    def load_resume_state(self, opt: dict[str, Any]) -> dict[str, Any] | None:
        """BasicSR's ``load_resume_state`` (the newest ``*.state`` with ``--auto_resume``, else
        ``path.resume_state``), on the model's device (CPU when ``num_gpu`` is 0), plus the loader state beside it."""
        from basicsr.utils import check_resume, scandir

        path = opt["path"].get("resume_state")
        if opt["auto_resume"]:
            folder = os.path.join("experiments", opt["name"], "training_states")
            found = sorted(int(n[: -len(".state")]) for n in scandir(folder, suffix=".state")) if os.path.isdir(folder) else []
            if found:
                path = opt["path"]["resume_state"] = os.path.join(folder, f"{found[-1]}.state")
        if not path:
            return None
        device = "cpu" if opt["num_gpu"] == 0 else f"cuda:{torch.cuda.current_device()}"
        resume_state: dict[str, Any] = torch.load(io.BytesIO(storage.read_local(path)), map_location=device, weights_only=True)
        check_resume(opt, resume_state["iter"])
        beside = Path(path).with_name(f"{resume_state['iter']}{STATE_SUFFIX}")
        if beside.is_file():
            self.pending = json.loads(storage.read_local(str(beside)))
        else:
            raise wdsr.LoaderStateError(
                f"{beside}: no wdsr loader state beside {path}; the run cannot continue at the same batch"
            )
        return resume_state

    def build_model(self, original: Callable[..., Any], opt: dict[str, Any]) -> Any:
        model = original(opt)
        feed, save = model.feed_data, model.save
        degraders: dict[Any, wdsr.Degrader] = {}

        def feed_data(data: dict[str, Any]) -> None:
            if "degrade" in data:  # a WdsrDataset with degrade=: (lq, gt) made on the model's device, float
                cfg: Any = self.loader.sr_dataset.config.degrade if self.loader is not None else None
                if cfg not in degraders:
                    degraders[cfg] = wdsr.Degrader(cfg).to(model.device)
                lq, gt = degraders[cfg]((data["gt"], data["degrade"]))
                data = {**{k: v for k, v in data.items() if k != "degrade"}, "lq": lq, "gt": gt}
            feed(data)  # moves lq/gt to the model's device
            model.lq = wdsr.to_float(model.lq)
            if "gt" in data:
                model.gt = wdsr.to_float(model.gt)

        def save_all(epoch: int, current_iter: int) -> None:
            if current_iter != -1 and opt["rank"] == 0 and self.loader is not None:
                # written before BasicSR's .state, so every .state has its loader state
                target = Path(opt["path"]["training_states"]) / f"{current_iter}{STATE_SUFFIX}"
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_suffix(".tmp")
                tmp.write_text(json.dumps(self.loader.state_dict()))
                os.replace(tmp, target)
            save(epoch, current_iter)

        model.feed_data, model.save = feed_data, save_all
        return model


def init_dist(original: Callable[..., Any], launcher: str, backend: str = "nccl", **kwargs: Any) -> None:
    """BasicSR's ``init_dist`` with CUDA; gloo under torchrun (``--launcher pytorch``) without it."""
    if torch.cuda.is_available():
        original(launcher, backend, **kwargs)
    elif launcher == "pytorch":
        torch.distributed.init_process_group("gloo")
    else:
        raise ValueError(f"--launcher {launcher} needs CUDA; without it use --launcher pytorch (torchrun, gloo)")


def model_to_device(original: Callable[..., Any], model: Any, net: torch.nn.Module) -> torch.nn.Module:
    """BasicSR's ``model_to_device``; DDP without ``device_ids`` for a distributed CPU run."""
    if not (model.opt["dist"] and model.device.type == "cpu"):
        return original(model, net)
    find_unused = model.opt.get("find_unused_parameters", False)
    return torch.nn.parallel.DistributedDataParallel(net.to(model.device), find_unused_parameters=find_unused)


def alias_functional_tensor() -> None:
    """basicsr 1.4.2 imports ``torchvision.transforms.functional_tensor``, which torchvision 0.17 renamed
    ``_functional_tensor``: alias the one module when only the new name exists."""
    import importlib

    try:
        importlib.import_module("torchvision.transforms.functional_tensor")
    except ImportError:
        try:
            sys.modules["torchvision.transforms.functional_tensor"] = importlib.import_module(
                "torchvision.transforms._functional_tensor"
            )
        except ImportError:
            return  # no torchvision at all: basicsr's own import says so


CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PIP_NAMES = {"cv2": "opencv-python-headless", "skimage": "scikit-image", "yaml": "pyyaml", "PIL": "pillow"}


def torchvision_pin(torch_version: str) -> str:
    """The torchvision release built for ``torch_version``: torch 2.m.p pairs with torchvision 0.(m+15).p
    (2.13.0 -> 0.28.0); ``torchvision`` alone for a version outside that rule."""
    parts = torch_version.split("+")[0].split(".")
    if len(parts) >= 3 and parts[0] == "2" and parts[1].isdigit() and parts[2].isdigit():
        return f"torchvision==0.{int(parts[1]) + 15}.{parts[2]}"
    return "torchvision"


def missing_imports() -> str | None:
    """What ``import basicsr`` lacks (torchvision, matched to this torch; scipy, requests; basicsr itself)
    as one line that says what to install, or None when it imports."""
    import importlib

    try:
        importlib.import_module("torchvision")
    except ImportError as exc:
        why = "is not installed" if exc.name == "torchvision" else f"cannot be imported ({str(exc)[:120]})"
        pin = torchvision_pin(torch.__version__)
        return (
            f"BasicSR needs torchvision, which {why}: pip install {pin} (the release for torch {torch.__version__}; "
            f"a CPU-only torch: add --index-url {CPU_INDEX}); see docs/integrations.md"
        )
    alias_functional_tensor()
    try:
        importlib.import_module("basicsr")
    except ImportError as exc:
        name = (exc.name or "").split(".")[0]
        if name in ("", "basicsr"):
            detail = "" if exc.name == "basicsr" else f" ({str(exc)[:120]})"
            return (
                f"this integration needs basicsr, which is not installed{detail}: pip install --no-deps "
                "--no-build-isolation basicsr==1.4.2 (after torch and torchvision); see docs/integrations.md"
            )
        return f"basicsr needs {name}, which is not installed: pip install {PIP_NAMES.get(name, name)}; see docs/integrations.md"
    return None


def install(session: Session) -> None:
    """Put the session's wrappers into BasicSR (for this process) and register ``WdsrDataset``."""
    alias_functional_tensor()
    import basicsr.train as train
    import basicsr.utils.options as options
    from basicsr.models.base_model import BaseModel
    from basicsr.utils.registry import DATASET_REGISTRY

    if TYPE not in DATASET_REGISTRY:
        DATASET_REGISTRY.register(WdsrDataset)

    def wrap(module: Any, name: str, fn: Callable[..., Any]) -> None:
        original = getattr(module, name)
        setattr(module, name, lambda *a, **k: fn(original, *a, **k))

    wrap(train, "build_dataset", session.build_dataset)
    wrap(train, "build_dataloader", session.build_dataloader)
    wrap(train, "build_model", session.build_model)
    train.load_resume_state = session.load_resume_state
    wrap(options, "init_dist", init_dist)
    wrap(BaseModel, "model_to_device", model_to_device)


def _yaml_seed(argv: Sequence[str]) -> int:
    """The top-level ``manual_seed`` of the ``-opt`` file (0 without one): BasicSR draws a seed per
    rank when it is missing, and the wdsr plan needs one seed on every rank. A ValueError (one line,
    naming the file and ``manual_seed``) for a file that cannot be read or a seed that is not an integer
    in [0, MAX_SEED]."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-opt", required=True)
    args, _ = parser.parse_known_args(argv)
    try:
        # safe_load, never BasicSR's own loader: BasicSR reads this file again with yaml.Loader, which runs
        # `!!python/object/apply` tags. This load comes first (main), so such a file stops here, before any
        # of it runs (tests/test_integrations_basicsr.py::test_a_python_tag_in_the_yaml_runs_nothing).
        doc = yaml.safe_load(storage.read_local(args.opt))  # a regular file: never a FIFO's hang
    except OSError as exc:
        raise ValueError(f"-opt {args.opt}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        mark = getattr(exc, "problem_mark", None)
        raise ValueError(f"-opt {args.opt}{f' line {mark.line + 1}' if mark else ''}: not a BasicSR YAML: {problem}") from None
    seed = doc.get("manual_seed") if isinstance(doc, dict) else None
    if seed is None:
        return 0
    return int(check_number(f"-opt {args.opt}: manual_seed", seed, 0, MAX_SEED, integer=True))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m wdsr.integrations.basicsr -opt train.yml [BasicSR's flags]``: BasicSR's
    ``train_pipeline`` with experiments under the current folder, as BasicSR's own ``train.py``. Without
    basicsr or what it imports: one line saying what to install, exit 2 (after the ``-opt`` file is
    checked, which needs neither)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        seed = _yaml_seed(argv)
    except ValueError as exc:
        print(f"wdsr.integrations.basicsr: error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    missing = missing_imports()
    if missing is not None:
        print(f"python -m wdsr.integrations.basicsr: error: {missing}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    session = Session(seed)
    install(session)
    from basicsr.train import train_pipeline

    sys.argv = [f"{sys.executable} -m wdsr.integrations.basicsr", *argv]  # BasicSR parses sys.argv itself
    train_pipeline(os.getcwd())
    return 0


if __name__ == "__main__":
    sys.exit(main())
