"""What the compiled decode paths (static.py on CUDA, compiled.py on CPU) share: when to
compile, the step sizes, dynamo's graph budget, and the one line a failed compile logs."""

from __future__ import annotations

import logging

import torch

PAD_TOKEN = 0  # any valid id: padded positions come after the real ones and are never read
_MIN_RECOMPILE_LIMIT = 64  # one compiled graph per step shape and model


def step_buckets(largest: int) -> tuple[int, ...]:
    """Step sizes 1, 2, 4, ... below `largest`, and `largest` itself: few shapes to compile."""
    sizes = [1]
    while sizes[-1] * 2 < largest:
        sizes.append(sizes[-1] * 2)
    return tuple(sorted({*sizes, largest}))


def compile_by_default(device: torch.device | str) -> bool:
    """The `compile: auto` rule for compiling at load: compiled static cache on CUDA, not on CPU
    (where the loader compiles a 4-bit target's steps in the background instead)."""
    return torch.device(device).type == "cuda"


def wants_compile(setting: bool | str, device: torch.device | str) -> bool:
    """A preset's or flag's compile setting (true | false | "auto") for a model on `device`."""
    if setting == "auto":
        return compile_by_default(device)
    if isinstance(setting, bool):
        return setting
    raise ValueError(f"compile must be true, false or 'auto', got {setting!r}")


def allow_a_graph_per_shape() -> None:
    """Each step shape (of each model) is its own graph: let dynamo compile that many.

    Read with a default: another caller may have deleted the key (torch's config module then
    hides it in every thread until someone sets it again; pytest >= 9.2's monkeypatch does that
    on undo), and setting it here brings it back."""
    config = torch._dynamo.config
    config.recompile_limit = max(getattr(config, "recompile_limit", 0), _MIN_RECOMPILE_LIMIT)


def compile_failed(log: logging.Logger, name: str, error: BaseException) -> str:
    """Log the one line that says compiling `name` failed and it decodes eagerly; return why."""
    reason = _one_line(error)
    log.warning("torch.compile failed for %s (%s): decoding eagerly", name, reason)
    return reason


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
