"""Preset `auto`: the rule in models.yaml, the largest GPU preset that fits this machine and can
load, else the fallback preset."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .config import ModelSpec, Preset, PresetFile
from .sources import availability_problem

__all__ = ["choose_auto_preset", "free_cuda_bytes"]

_GB = 1024**3


def choose_auto_preset(
    config: PresetFile,
    free_gpu_bytes: int | None = None,
    problem_of: Callable[[ModelSpec], str | None] = availability_problem,
) -> tuple[str, list[str]]:
    """The rule in models.yaml: the largest GPU preset that fits and can load, else the fallback.

    Returns the preset name and one line per preset passed over (and one for the pick).
    free_gpu_bytes and problem_of are parameters so tests can describe a machine.
    """
    if free_gpu_bytes is None:
        free_gpu_bytes = free_cuda_bytes()
    gpu_presets = sorted(
        (p for p in config.presets.values() if p.requires_gpu), key=lambda p: p.memory_gb, reverse=True
    )
    fallback = config.auto_fallback
    if not free_gpu_bytes:
        skipped = ", ".join(p.name for p in gpu_presets) or "none defined"
        return fallback, [f"auto: no CUDA GPU, picked {fallback} (GPU presets: {skipped})"]
    notes = []
    for preset in gpu_presets:
        why = _why_not_runnable(preset, free_gpu_bytes, problem_of)
        if why is None:
            notes.append(f"auto: picked {preset.name} ({free_gpu_bytes / _GB:.1f} GB of GPU memory free)")
            return preset.name, notes
        notes.append(f"auto: passed over {preset.name}: {why}")
    notes.append(f"auto: picked {fallback}")
    return fallback, notes


def _why_not_runnable(
    preset: Preset, free_gpu_bytes: int, problem_of: Callable[[ModelSpec], str | None]
) -> str | None:
    if preset.memory_gb * _GB > free_gpu_bytes:
        return f"needs {preset.memory_gb:g} GB of GPU memory, {free_gpu_bytes / _GB:.1f} GB free"
    for spec in (preset.target, preset.draft):
        problem = problem_of(spec) if spec is not None else None
        if problem:
            return f"{spec.label}: {problem}"
    return None


def free_cuda_bytes() -> int:
    """Free memory of all visible GPUs together (0 without CUDA)."""
    if not torch.cuda.is_available():
        return 0
    return sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
