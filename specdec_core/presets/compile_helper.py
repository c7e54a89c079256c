"""The compile helper: a process that loads the same target as the app and compiles its steps
into the step cache, which the app then loads (decoding/helper_process.py says why a process).

    python -m specdec_core.presets.compile_helper < recipe (pickled CompileRecipe)

It loads the target as load_preset did, with `compile: true` (the same preparation, the same
CompiledSteps, so the same cache key: a step's file is named by the model's structure, not its
weights) and compiles every step shape, chains then trees, saving each. It ends when its parent
does: a compile for an app that is gone is only load on the machine.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time

from .compile_recipe import CompileRecipe
from .config import PresetFile
from .loading import load_preset

_PARENT_POLL_S = 1.0
_NICENESS = 10


def compile_steps(recipe: CompileRecipe):
    """Load the recipe's target with `compile: true`: its CompiledSteps, compiled (or loaded) and
    saved in the step cache."""
    name = recipe.preset.name
    models = load_preset(name, PresetFile(path=None, presets={name: recipe.preset}, auto_fallback=name),
                         load_draft=False, compile=True, load_eagle=recipe.load_eagle,
                         load_medusa=recipe.load_medusa, cpu_weights=recipe.cpu_weights)
    return models.path("target")


def main() -> None:
    recipe: CompileRecipe = pickle.loads(sys.stdin.buffer.read())
    _end_with_parent()
    if hasattr(os, "nice"):
        os.nice(_NICENESS)  # below whatever else the machine runs (the app's replies stop it anyway)
    started = time.perf_counter()
    steps = compile_steps(recipe)
    if steps.fallback_reason:
        sys.exit(f"compiling failed: {steps.fallback_reason}")
    print(f"compiled the steps of {recipe.preset.name} in {time.perf_counter() - started:.0f} s "
          f"({steps.loaded} loaded from the cache)", flush=True)


def _end_with_parent() -> None:
    """End this process when the one that started it has ended."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent watch", daemon=True).start()


if __name__ == "__main__":
    main()
