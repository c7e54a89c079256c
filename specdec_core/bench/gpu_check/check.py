"""The GPU check's run: its parts in order, each timed, a failing one recorded while the rest
still run, the report written after each."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from ...cli import EXIT_ERROR, inform, one_line
from ..machine import free_memory
from .app import part_app
from .correctness import part_correctness
from .part import FAIL, FULL, NOT_RUN, PASS, TINY, Part, Scale
from .presets import part_loading
from .report import environment, part_dict, write
from .speed import part_ceiling, part_eagle_cost, part_fast_path
from .ties import part_bf16_ties

PART_FUNCTIONS: dict[str, Callable] = {
    "correctness": part_correctness,
    "fast_path": part_fast_path,
    "ceiling": part_ceiling,
    "bf16_ties": part_bf16_ties,
    "loading": part_loading,
    "eagle_cost": part_eagle_cost,
    "app": part_app,
}
PARTS = tuple(PART_FUNCTIONS)  # in the order they run: later parts reuse what earlier ones built


def gpu_check(out: Path, *, tiny: bool = False, parts: str | None = None, device: str | None = None,
              command: str = "") -> int:
    """The command: 0 when no part failed, 1 when one did, EXIT_ERROR (one line) for bad arguments."""
    scale = TINY if tiny else FULL
    if device:
        scale = replace(scale, device=device)
    wanted = [p.strip() for p in parts.split(",") if p.strip()] if parts else list(PARTS)
    unknown = [p for p in wanted if p not in PARTS]
    if unknown:
        print(f"error: unknown parts {', '.join(unknown)}; parts: {', '.join(PARTS)}", file=sys.stderr)
        return EXIT_ERROR
    if scale.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA device here: run it on a GPU machine, or pass --tiny (CPU, tiny configs)",
              file=sys.stderr)
        return EXIT_ERROR
    if not scale.device.startswith("cuda"):
        torch.set_num_threads(1)  # small models on a shared CPU: one thread is faster than contending ones
    report = run_check(scale, wanted, Path(out), command)
    inform(f"wrote {Path(out) / 'gpu_check.json'} and gpu_check.md")
    return 0 if all(p["status"] != FAIL for p in report["parts"]) else 1


def run_check(scale: Scale, parts: list[str], out: Path, command: str = "") -> dict:
    """Run the parts in order, writing the report after each; returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    report = {"command": command, "scale": scale.__dict__, "environment": environment(scale.device), "parts": [],
              "total_s": 0.0}
    started = time.perf_counter()
    shared: dict = {}  # models and compiled steps the later parts reuse
    for name in parts:
        part = Part(name)
        inform(f"gpu_check: {name} ...")
        t0 = time.perf_counter()
        try:
            reason = PART_FUNCTIONS[name](scale, part, shared, out)
            if reason:  # a package or a piece of this build is missing
                part.status, part.reason = NOT_RUN, reason
            else:
                part.status = FAIL if any(c.status == FAIL for c in part.checks) else PASS
        except Exception as error:  # noqa: BLE001 - a failing part is recorded; the rest still runs
            part.status, part.reason = FAIL, one_line(error)[:500]
            part.data["traceback"] = traceback.format_exc(limit=8)[-3000:]
        part.seconds = round(time.perf_counter() - t0, 1)
        inform(f"gpu_check: {name}: {part.status} in {part.seconds:.0f} s {part.reason}")
        report["parts"].append(part_dict(part))
        report["total_s"] = round(time.perf_counter() - started, 1)
        write(out, report)
    shared.clear()
    free_memory()
    return report
