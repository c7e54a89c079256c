"""What the trainer tests (EAGLE and Medusa) share: a tiny preset to train for, run settings small
enough for seconds, their command-line spelling, and a work folder that reuses generated data."""

from __future__ import annotations

from pathlib import Path

TRAIN_PRESETS = """\
auto_fallback: tiny-train
presets:
  tiny-train:
    description: a tiny random Llama target to train drafters for
    target: ./target
    drafter: prompt_lookup
    memory_gb: 0.1
"""
# Small enough to run in seconds: 2 shards of 4 prompts, 10-token replies, 2 epochs of 2-sequence steps.
QUICK_DATA = dict(shards=2, per_shard=4, gen_batch=4, max_new_tokens=10)
QUICK_TRAINING = dict(epochs=2, batch=2)


def flags(settings: dict) -> list[str]:
    """The command-line spelling of run settings: {"per_shard": 4} -> ["--per-shard", "4"]."""
    return [part for name, value in settings.items() for part in (f"--{name.replace('_', '-')}", str(value))]


def on_shared_data(settings_type: type, config: Path, out: Path, data_dir: Path, **settings):
    """A trainer's settings for preset tiny-train writing `out`, with a work folder beside it
    whose data/ is `data_dir` (linked): the run trains on data another run generated, when only
    the training is under test."""
    work = out.parent / "work"
    if not (work / "data").exists():
        work.mkdir(parents=True, exist_ok=True)
        (work / "data").symlink_to(data_dir)
    return settings_type("tiny-train", str(out), config=str(config), work=str(work), **settings)
