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
    "shardmaker.deprecation",
    "shardmaker.commandline",
    "shardmaker.exitcodes",
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


# modules allowed to import our own modules inside a function: the two CLIs load a sub-command's
# code only when it runs (``wdsr --help`` must not import torch's training stack)
LAZY_IMPORTERS = ("shardmaker.cli", "wdsr.tools.cli")


def _all_imports(tree: ast.Module) -> list[tuple[str, str | None, int, bool]]:
    """``(module, name, line, top_level)`` of every absolute import of ours, ``top_level`` False for an
    import inside a function or under ``if TYPE_CHECKING:``."""
    inner: set[int] = set()
    for node in ast.walk(tree):
        deferred = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
            isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        )
        if deferred:
            inner |= {id(sub) for sub in ast.walk(node) if isinstance(sub, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno, id(node) not in inner) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.module, a.name, node.lineno, id(node) not in inner) for a in node.names]
    return [i for i in out if i[0].split(".")[0] in ("wdsr", "shardmaker")]


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (wherever the import stands). ``from pkg import Name``
    lands in the module of ``pkg`` that the package's face took ``Name`` from, so a face that only
    hands names on draws no loop."""
    trees = {**_modules("wdsr"), **_modules("shardmaker")}
    faces: dict[str, dict[str, str]] = {}  # package -> re-exported name -> the module it comes from
    for mod, tree in trees.items():
        if (ROOT / mod.replace(".", "/") / "__init__.py").exists():
            faces[mod] = {
                a.asname or a.name: _target(n.module, a.name)
                for n in tree.body
                if isinstance(n, ast.ImportFrom) and n.module and n.level == 0
                for a in n.names
            }
    graph: dict[str, set[str]] = {m: set() for m in trees}
    for mod, tree in trees.items():
        for module, name, _, _ in _all_imports(tree):
            target = _target(module, name)
            while target in faces and name in faces[target] and faces[target][name] != target:
                target = faces[target][name]
            if target in trees and target != mod:
                graph[mod].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_our_modules():
    """Function-local and ``TYPE_CHECKING`` imports count: they hide a loop, they do not remove it."""
    assert not _cycles(_graph()), _cycles(_graph())


def test_no_function_local_import_of_our_own_modules():
    bad = [
        f"{mod}:{line} imports {module}" + (f".{name}" if name else "")
        for mod, tree in {**_modules("wdsr"), **_modules("shardmaker")}.items()
        if mod not in LAZY_IMPORTERS
        for module, name, line, top in _all_imports(tree)
        if not top
    ]
    assert not bad, bad


def _architecture_names() -> tuple[set[str], set[str]]:
    """The module files and the public names ``docs/architecture.md`` names in backticks."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    import re

    files = set(re.findall(r"`((?:wdsr|shardmaker)/[\w/]+\.py)`", text))
    names = set(re.findall(r"`((?:wdsr|shardmaker)\.[A-Za-z_][\w.]*)`", text))
    return files, names


def test_the_architecture_doc_names_every_module_and_only_what_exists():
    files, names = _architecture_names()
    ours = {
        str(p.relative_to(ROOT))
        for pkg in ("wdsr", "shardmaker")
        for p in (ROOT / pkg).rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
    }
    assert not files - ours, f"docs/architecture.md names files that do not exist: {sorted(files - ours)}"
    assert not ours - files, f"docs/architecture.md misses modules: {sorted(ours - files)}"
    missing = []
    for dotted in sorted(names):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                missing.append(dotted)
            break
        else:
            missing.append(dotted)
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def test_the_architecture_doc_lists_every_export():
    import wdsr

    _, names = _architecture_names()
    text = (ROOT / "docs" / "architecture.md").read_text()
    absent = [n for n in wdsr.__all__ if f"wdsr.{n}" not in names and f"`{n}`" not in text]
    assert not absent, f"docs/architecture.md misses exports of wdsr: {absent}"
