"""What the compile helper (compile_helper.py) is told: the recipe of the app's target, and the
command that runs the helper. loading.py builds these, and the helper loads through loading.py,
so they live apart from the helper."""

from __future__ import annotations

import pickle
import sys
from dataclasses import dataclass

from ..decoding.helper_process import HelperCommand
from .config import Preset
from .sources import cache_root

HELPER_MODULE = "specdec_core.presets.compile_helper"


@dataclass(frozen=True)
class CompileRecipe:
    """What the helper needs to load the app's target as the app did."""

    preset: Preset
    load_eagle: bool  # whether the app loaded the preset's EAGLE head (its layers' features are outputs)
    load_medusa: bool
    cpu_weights: str


def helper_command(recipe: CompileRecipe) -> HelperCommand:
    """The command that compiles `recipe`'s target steps in a helper process."""
    return HelperCommand(argv=(sys.executable, "-m", HELPER_MODULE), stdin=pickle.dumps(recipe),
                         log=cache_root() / "compiled" / "compile-helper.log")
