"""The training loop both trainers run: the learning rate's schedule, one optimizer step's recipe,
held-out measurements at evaluation points (the learning curve), and checkpoints that resume.

A checkpoint is written every `checkpoint_every` steps, at every evaluation point and when the
time runs out; the same command started again continues from it, and ends with the same weights
as a run never stopped (the batches' order comes from the seed and the step alone).
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .base import TRAIN_DTYPES, RunSettings
from .data import refuse_other_settings

# Settings added after checkpoints were first written, with the value such a checkpoint ran with.
SETTINGS_ADDED_LATER = {"prompts": "templates", "rewrite_heldout": None}


def train_loop(settings: RunSettings, model: torch.nn.Module, optimizer, checkpoint: Path, per_epoch: int,
               step: Callable[[int], tuple[torch.Tensor, int, dict]], evaluate: Callable[[], tuple[dict, str]],
               eval_steps: Collection[int] = (), stop_after: int | None = None) -> Progress | None:
    """Train `model` for settings.epochs epochs of `per_epoch` steps (or until settings.max_minutes),
    continuing from `checkpoint` when it exists. `step(i)`: step i's loss, the positions it trained
    and what the progress bar shows besides the loss; `evaluate()`: a held-out measurement (kept in
    the learning curve) and its line for the log, taken at the end of every epoch and after each step
    of `eval_steps` (points inside the first epoch, where the curve moves most). Returns the
    progress, or None once `stop_after` steps are done before the end (how tests stand in for a
    killed run)."""
    total_steps = per_epoch * settings.epochs
    eval_steps = set(eval_steps) | {per_epoch * epoch for epoch in range(1, settings.epochs + 1)}
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(total_steps))
    progress = resume(checkpoint, settings, model, optimizer, scheduler)
    resumed_at = time.monotonic() - progress.seconds
    with tqdm(total=total_steps, initial=progress.step, desc="training", unit="step") as bar:
        while progress.step < total_steps and not settings.out_of_time(progress.seconds):
            model.train()
            with autocast(settings.train_dtype):
                loss, positions, shown = step(progress.step)
            optimizer_step(loss, model, optimizer, scheduler)
            progress.stepped(positions, resumed_at)
            bar.update(1)
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", **shown)
            if progress.step in eval_steps:
                point, line = evaluate()
                progress.history.append({"step": progress.step, "tokens": progress.tokens,
                                         "epoch": progress.step / per_epoch, **point})
                bar.write(f"step {progress.step}: {line}")
            progress.stopped_early = settings.out_of_time(progress.seconds)
            if progress.step % settings.checkpoint_every == 0 or progress.step in eval_steps or progress.stopped_early:
                save_checkpoint(checkpoint, settings, model, optimizer, scheduler, progress)
            if stop_after is not None and stop_after <= progress.step < total_steps:
                return None
    return progress


def autocast(train_dtype: str):
    dtype = TRAIN_DTYPES[train_dtype]
    return torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()


def schedule(total_steps: int):
    """Linear warm-up over 5% of the steps, then cosine down to 10% of the learning rate."""
    warmup = max(1, total_steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = (step - warmup) / max(1, total_steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))

    return factor


def optimizer_step(loss: torch.Tensor, model: torch.nn.Module, optimizer, scheduler) -> None:
    """One step of both trainers' recipe: gradients clipped to norm 1, then the learning rate's schedule."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()


# ---------------------------------------------------------------- checkpoints


@dataclass
class Progress:
    """What a checkpoint holds besides the weights."""

    step: int = 0
    tokens: int = 0  # positions trained so far (with repeats over epochs)
    seconds: float = 0.0  # training time so far, over all resumptions
    history: list[dict] = field(default_factory=list)  # held-out measurements at evaluation points
    stopped_early: bool = False

    def stepped(self, positions: int, resumed_at: float) -> None:
        """Count a step that trained `positions` positions; `resumed_at`: when training would have
        started had it never stopped (time.monotonic() less the seconds trained before)."""
        self.step += 1
        self.tokens += positions
        self.seconds = time.monotonic() - resumed_at


def resume(path: Path, settings: RunSettings, model, optimizer, scheduler) -> Progress:
    """The progress of the checkpoint at `path` (loaded into model, optimizer, scheduler), or a
    fresh start when there is none. Each trainer names its own checkpoint, so both can share one
    work folder (its data)."""
    if not path.exists():
        return Progress()
    # weights_only: tensors and plain values only. A checkpoint is a file in a folder others may
    # write to, and unpickling anything else could run code it names.
    try:
        state = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's message goes on to say how to load it anyway; only its reason is kept.
        reason = next((line.strip().split(". ")[0] for line in str(error).splitlines() if "Unsupported" in line), "")
        raise ValueError(f"{path} holds more than tensors and plain values, so it is not loaded"
                         f"{f' ({reason})' if reason else ''}: delete it to start the training afresh") from None
    refuse_other_settings({**SETTINGS_ADDED_LATER, **state["settings"]}, settings.fingerprint(), f"{path} is a run")
    model.load_state_dict(state["head"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return Progress(**state["progress"])


def save_checkpoint(path: Path, settings: RunSettings, model, optimizer, scheduler, progress: Progress) -> None:
    """Written to a temporary file, then renamed: a checkpoint on disk is always whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"settings": settings.fingerprint(), "head": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "progress": asdict(progress)}
    temporary = path.with_name(path.name + ".tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)
