"""The folders show the layers: no module of specdec_core imports from a layer above its own.

Layers, bottom up: the decode paths (decoding/: how a model runs its steps), the 4-bit CPU
kernels (kernels/), the algorithm (specdec_core/*.py: engine, acceptance, sampling, ...; and the draft policy, policy/),
the drafters (drafters/), presets and loading (presets/), then the wings that use them (bench/,
train/, serve/), which do not import each other; the entry points (`python -m specdec_core`,
`python -m specdec_core.cost_model`) and the app sit on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "specdec_core"
LAYERS = {"decoding": 0, "kernels": 1, "": 2, "policy": 2, "drafters": 3, "presets": 4, "bench": 5, "train": 5, "serve": 5}
WINGS = 5  # the layer whose folders must not import each other
ENTRY_POINTS = {"__main__.py", "cost_model.py", "gpu_check.py", "train_eagle.py", "train_medusa.py", "train_retrieval.py"}  # faces that live in the top folder
TOP = 6


def _folder(module: str) -> str:
    """The layer's folder a dotted module name below specdec_core belongs to ("" for the core).
    A folder imported by its own name (`from .drafters import X`) is that folder's."""
    first = module.split(".")[0]
    return first if first in LAYERS else ""


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
        return (TOP if relative.name in ENTRY_POINTS else LAYERS[""]), ""
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
            sideways = rank == target_rank == WINGS and folder != wing
            if target_rank > rank or sideways:
                upward.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not upward, "imports that point up or across wings:\n" + "\n".join(upward)


def test_the_check_sees_relative_imports():
    names = _imports(PACKAGE / "presets" / "loaded.py")
    assert "presets.config" in names and "engine" in names


def test_a_folder_imported_by_its_own_name_counts_as_that_folder():
    assert _folder("drafters") == "drafters" and _folder("drafters.eagle") == "drafters"
    assert _folder("engine") == "" and _folder("decoding.eager") == "decoding"


# ---------------------------------------------------------------- the UI (specdec_app/) and app.py

APP = PACKAGE.parent / "specdec_app"
# Bottom up: pure formatting and flags, what an event reads and updates, one reply, where the
# elements sit, what each control does (and build_ui), the package's face.
APP_LAYERS = {"render": 0, "speedup": 1, "stops": 0, "history": 2, "settings": 3, "reply": 4, "layout": 5, "wiring": 6,
              "__init__": 7}


def _app_imports(path: Path) -> list[str]:
    """specdec_app modules that `path` imports (relative imports, one level)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found += [node.module] if node.module else [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec_app."):
            found.append(node.module.removeprefix("specdec_app."))
    return found


def test_every_ui_module_has_its_place_and_imports_only_below_it():
    modules = {p.stem for p in APP.glob("*.py")}
    assert modules == set(APP_LAYERS), f"a new UI module needs its place in APP_LAYERS: {modules ^ set(APP_LAYERS)}"
    upward = [f"{path.name} imports {name}" for path in APP.glob("*.py") for name in _app_imports(path)
              if APP_LAYERS[name] >= APP_LAYERS[path.stem]]
    assert not upward, "UI imports that point up or sideways:\n" + "\n".join(upward)


def test_specdec_core_never_imports_gradio_or_the_ui():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offenders += [f"{path.relative_to(PACKAGE)} imports {n}" for n in names
                          if n.split(".")[0] in ("gradio", "specdec_app", "app")]
    assert not offenders, "\n".join(offenders)
