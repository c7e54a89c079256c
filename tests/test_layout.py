"""The folders show the layers: no module of specdec_core imports from a layer above its own.

Layers, bottom up: the core (specdec_core/*.py), drafters/, presets/, then the wings that use
them (bench/, train/, serve/), which do not import each other; the entry points
(`python -m specdec_core`, `python -m specdec_core.cost_model`) and the app sit on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "specdec_core"
LAYERS = {"": 0, "drafters": 1, "presets": 2, "bench": 3, "train": 3, "serve": 3}
ENTRY_POINTS = {"__main__.py", "cost_model.py", "gpu_check.py", "train_eagle.py"}  # faces that live in the top folder
TOP = 4


def _folder(module: str) -> str:
    """The wing a dotted module name below specdec_core belongs to ("" for the core)."""
    parts = module.split(".")
    return parts[0] if len(parts) > 1 and parts[0] in LAYERS else ""


def _imports(path: Path) -> list[str]:
    """Modules below specdec_core that `path` imports, as dotted names relative to the package."""
    here = path.relative_to(PACKAGE).with_suffix("").parts
    package = list(here[:-1])  # the folder `from .x` resolves in (for __init__ too)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                names = [target] if node.module else [".".join([*base, a.name]) for a in node.names]
                found += names
            elif node.module and node.module.startswith("specdec_core."):
                found.append(node.module.removeprefix("specdec_core."))
        elif isinstance(node, ast.Import):
            found += [a.name.removeprefix("specdec_core.") for a in node.names if a.name.startswith("specdec_core.")]
    return [name for name in found if name]


def _rank(path: Path) -> tuple[int, str]:
    relative = path.relative_to(PACKAGE)
    if len(relative.parts) == 1:
        return (TOP if relative.name in ENTRY_POINTS else 0), ""
    return LAYERS[relative.parts[0]], relative.parts[0]


def test_every_folder_is_a_known_layer_or_wing():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders <= set(LAYERS), f"a new folder needs its place in LAYERS: {folders - set(LAYERS)}"


def test_no_module_imports_from_a_layer_above_it():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == PACKAGE:
            continue  # the package's public names: re-exports from below
        rank, wing = _rank(path)
        for name in _imports(path):
            folder = _folder(name)
            if name.split(".")[0] in {p.removesuffix(".py") for p in ENTRY_POINTS}:
                target_rank = TOP
            else:
                target_rank = LAYERS[folder]
            sideways = rank == target_rank == 3 and folder != wing
            if target_rank > rank or sideways:
                upward.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not upward, "imports that point up or across wings:\n" + "\n".join(upward)


def test_the_check_sees_relative_imports():
    names = _imports(PACKAGE / "presets" / "loaded.py")
    assert "presets.config" in names and "engine" in names
