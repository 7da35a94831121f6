"""The house rules, read from the code's own imports (docs/architecture.md): shardmaker never imports
wdsr; wdsr reaches shardmaker only through its public doors and their ``__all__``; wdsr's wings import
downwards only; no private name crosses a module boundary; no function over 100 lines; a small face."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOORS = (
    "shardmaker",
    "shardmaker.format",
    "shardmaker.imaging",
    "shardmaker.storage",
    "shardmaker.errors",
    "shardmaker.compat",
    "shardmaker.clikit",
)
# wdsr's floors, bottom up: a module imports from its own floor or those below it
FLOORS = (
    ("base", ("wdsr.errors", "wdsr.env", "wdsr.seeds", "wdsr.metrics", "wdsr.bounds")),
    ("store", ("wdsr.store",)),
    ("pipeline", ("wdsr.pipeline", "wdsr.degrade")),
    ("face", ("wdsr", "wdsr.config", "wdsr.dataset", "wdsr.loader", "wdsr.state", "wdsr.wds")),
    ("top", ("wdsr.train", "wdsr.tools", "wdsr.integrations", "wdsr.__main__")),
)


def _modules(package: str) -> dict[str, ast.Module]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def _imports(name: str, tree: ast.Module) -> list[tuple[str, str | None, int]]:
    """``(module, imported name or None, line)`` of every absolute import, ``from pkg import mod`` as ``pkg.mod``."""
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.module, a.name, node.lineno) for a in node.names]
    return out


def _floor(module: str) -> int:
    best, depth = -1, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > depth:
                best, depth = i, len(p)
    return best


def _target(module: str, name: str | None) -> str:
    """The module an import lands in: ``from wdsr import env`` is ``wdsr.env``; a class from ``wdsr`` is ``wdsr``."""
    if name is not None and (ROOT / (module.replace(".", "/") + "/" + name + ".py")).exists():
        return f"{module}.{name}"
    if name is not None and (ROOT / (module.replace(".", "/") + "/" + name)).is_dir():
        return f"{module}.{name}"
    return module


def test_shardmaker_never_imports_wdsr():
    bad = [
        f"{mod}:{line} imports {target}"
        for mod, tree in _modules("shardmaker").items()
        for target, _, line in _imports(mod, tree)
        if target == "wdsr" or target.startswith("wdsr.")
    ]
    assert not bad, bad


def test_wdsr_uses_shardmaker_only_through_its_doors_and_their_public_names():
    bad = []
    for mod, tree in _modules("wdsr").items():
        for module, name, line in _imports(mod, tree):
            if not module.startswith("shardmaker"):
                continue
            target = _target(module, name)
            if target in DOORS and name is not None and target != module:
                continue  # ``from shardmaker import format as fmt``: the door itself
            if module not in DOORS:
                bad.append(f"{mod}:{line}: {module} is not a public module of shardmaker")
            elif name is not None and name not in importlib.import_module(module).__all__:
                bad.append(f"{mod}:{line}: {module}.{name} is not in its __all__")
        aliases = {
            a.asname or a.name: f"{n.module}.{a.name}"
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("shardmaker")
            for a in n.names
            if f"{n.module}.{a.name}" in DOORS
        }
        for node in ast.walk(tree):  # fmt.load, imaging.decode, storage.join: names of the door's __all__
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                door = aliases[node.value.id]
                if node.attr not in importlib.import_module(door).__all__:
                    bad.append(f"{mod}:{node.lineno}: {door}.{node.attr} is not in its __all__")
    assert not bad, bad


def test_every_door_names_what_it_offers():
    for door in DOORS:
        mod = importlib.import_module(door)
        assert mod.__all__ and all(hasattr(mod, n) for n in mod.__all__), door


def test_wdsr_imports_run_downwards():
    bad = []
    for mod, tree in _modules("wdsr").items():
        here = _floor(mod)
        assert here >= 0, f"{mod} is on no floor of the house (tests/test_house.py FLOORS)"
        for module, name, line in _imports(mod, tree):
            if not (module == "wdsr" or module.startswith("wdsr.")):
                continue
            target = _target(module, name)
            if _floor(target) > here:
                bad.append(f"{mod}:{line} ({FLOORS[here][0]}) imports {target} ({FLOORS[_floor(target)][0]})")
    assert not bad, bad


@pytest.mark.parametrize("package", ["wdsr", "shardmaker"])
def test_no_private_name_crosses_a_module(package):
    bad = [
        f"{mod}:{line}: {module}.{name}"
        for mod, tree in _modules(package).items()
        for module, name, line in _imports(mod, tree)
        if name and name.startswith("_") and not name.startswith("__") and module.split(".")[0] in ("wdsr", "shardmaker")
    ]
    assert not bad, bad


@pytest.mark.parametrize("package", ["wdsr", "shardmaker"])
def test_no_function_over_100_lines(package):
    long = [
        f"{mod}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for mod, tree in _modules(package).items()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 100
    ]
    assert not long, long


def test_the_face_is_small():
    top = sorted(p.name for p in (ROOT / "wdsr").glob("*.py"))
    assert len(top) <= 14, top


def test_the_license_is_an_spdx_string():
    """setuptools stops building projects whose ``project.license`` is a table on 2027-02-18."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert any(r.startswith("setuptools>=77") for r in meta["build-system"]["requires"])


def test_the_default_image_is_the_small_cpu_one_and_cuda_is_one_documented_line():
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu\n" in text  # without it PyPI's torch is the CUDA build
    assert "--build-arg BASE=nvidia/cuda" in text and "--build-arg TORCH_INDEX= ." in text
