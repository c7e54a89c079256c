"""What the EAGLE and Medusa trainers share: the settings of a run on self-distilled data (the
data recipe and the training plumbing, `RunSettings`), the data stage that writes the shards,
the train / held-out split, and the command line's shared options (the training loop and its
checkpoints: loop.py).

Both trainers read the same shards: each sequence's features hold `aux` (the residual stream
entering three layers, what an EAGLE-3 head reads) and `final` (the target's last hidden state,
what Medusa heads read), so a work folder either trainer wrote, or `train_eagle --data-only`
wrote, serves both.
"""

from __future__ import annotations

import argparse
import ctypes
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..cli import inform, run_guarded
from ..presets.loading import load_plain_target
from .data import PASSAGE_SOURCES, PROMPT_SOURCES, DataSettings, generate_data
from .dataset import Sequence, held_out_shards, load_sequences, same_prompts

DATA_DTYPES = {"bfloat16": torch.bfloat16}  # besides "target"
TRAIN_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}  # None: no autocast
SAVE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# With --data-dtype other than "target", the held-out shards written again by the target itself:
# the head is measured on the replies its user gets.
HELDOUT_BY_TARGET = "heldout_by_target"


@dataclass(frozen=True)
class RunSettings:
    """A trainer run: the self-distilled data's recipe, and what every training loop needs.
    Each trainer's settings add their own model's fields."""

    preset: str
    out: str
    config: str | None = None  # a models.yaml other than the bundled one
    work: str | None = None  # data shards and checkpoints; default OUT/train_work (either trainer's)
    seed: int = 0
    shards: int = 40  # data shards of `per_shard` prompts each
    per_shard: int = 32
    gen_batch: int = 32
    max_new_tokens: int = 192
    passages: str = "target"  # what summarize / answer-from / translate prompts read (data.PASSAGE_SOURCES)
    prompts: str = "templates"  # the prompt source (data.PROMPT_SOURCES): prompts.py, or varied.py's mix
    # What writes the data: "target" (the target as it decodes) or "bfloat16" (its weights in bf16
    # on stock layers, see data_model: faster on CPUs with bf16 instructions, AMX or AVX512-BF16).
    data_dtype: str = "target"
    # With such a writer, how many held-out shards (the first ones) the target writes again and the
    # head is measured on; None: all. The rest stay out of training all the same. (The 4-bit
    # SmolLM2 target writes a 256-prompt shard of varied prompts in about 4.5 minutes, the bf16
    # twin in 2.7 on 2 AVX512-BF16 cores.)
    rewrite_heldout: int | None = None
    # What the trained matmuls run in: "bfloat16" autocasts them (weights, optimizer and loss stay
    # fp32): on a CPU with AMX an EAGLE head's matmuls run 4x faster and a whole step about 1.45x;
    # with AVX512-BF16 alone a whole step 1.5x (1,186 against 789 positions/s, AMD EPYC).
    train_dtype: str = "float32"
    epochs: int = 3
    batch: int = 8  # sequences per optimizer step
    lr: float = 1e-3
    checkpoint_every: int = 25
    save_dtype: str = "float16"
    max_minutes: float | None = None  # stop training (and write the result) after this long
    threads: int | None = None
    data_only: bool = False  # write the data shards and stop (no training)
    command: str = ""  # the command line, for the output's README

    # What may change between a run and its resumption without changing the result.
    RESUMABLE = ("out", "work", "max_minutes", "threads", "command", "checkpoint_every", "data_only")

    def fingerprint(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in self.RESUMABLE}

    @property
    def rewrites_heldout(self) -> bool:
        """Whether the held-out shards are written again by the target (see HELDOUT_BY_TARGET)."""
        return self.data_dtype != "target"

    @property
    def rewritten_heldout(self) -> list[int]:
        """The held-out shards the head is measured on, written again by the target when it
        rewrites them: the first `rewrite_heldout` (all when None)."""
        return sorted(held_out_shards(self.shards))[: self.rewrite_heldout]

    @property
    def work_dir(self) -> Path:
        return Path(self.work) if self.work else Path(self.out) / "train_work"

    @property
    def data_settings(self) -> DataSettings:
        return DataSettings(self.shards, self.per_shard, self.gen_batch, self.max_new_tokens, self.seed, self.passages,
                            self.prompts)

    def out_of_time(self, seconds: float) -> bool:
        return self.max_minutes is not None and seconds > self.max_minutes * 60


def data_model(settings: RunSettings, target):
    """The model that writes the data's replies and features. "bfloat16": the target's own weights
    in bf16 on stock layers, so batched generation runs on bf16 matrix units. For a 4-bit GGUF
    target those are its dequantised weights rounded to bf16: measured on SmolLM2-135M, its
    features differ from the 4-bit target's by 0.5-1% (relative norm at the inputs of layers 2,
    15 and 27) and its greedy replies to 12 prompts agreed with the target's for the first 6 to
    96 tokens (all 96 on 3, median 42.5)."""
    if settings.data_dtype == "target":
        return target
    return load_plain_target(settings.preset, settings.config, dtype=DATA_DTYPES[settings.data_dtype])


def write_data(settings: RunSettings, target, tokenizer, layer_ids) -> None:
    """The data stage: the shards not on disk yet, and with a cheaper writer the held-out shards
    again by the target. The same layer ids for both trainers (the EAGLE head's default), so the
    folder's recorded recipe is the same whichever trainer writes it."""
    data_dir = settings.work_dir / "data"
    with tqdm(total=settings.shards, desc="data shards", unit="shard") as bar:
        generate_data(lambda: data_model(settings, target), tokenizer, data_dir, settings.data_settings, layer_ids,
                      progress=lambda done, total: bar.update(done - bar.n), writer=settings.data_dtype, report=bar.write)
    if settings.rewrites_heldout:
        held = settings.rewritten_heldout
        with tqdm(total=len(held), desc="held-out shards by the target", unit="shard") as bar:
            generate_data(lambda: target, tokenizer, data_dir, settings.data_settings, layer_ids,
                          progress=lambda done, total: bar.update(done - bar.n), indices=held,
                          out_dir=settings.work_dir / HELDOUT_BY_TARGET, report=bar.write)


def load_split(settings: RunSettings, tokenizer) -> tuple[list[Sequence], list[Sequence]]:
    """(training sequences, held-out sequences) of the work folder's data; the held-out ones
    written by the target itself (see HELDOUT_BY_TARGET). Refuses data too small to split."""
    train_set, heldout = load_sequences(settings.work_dir / "data", settings.data_settings, tokenizer)
    if settings.rewrites_heldout:
        heldout = same_prompts(settings.work_dir / HELDOUT_BY_TARGET, settings.rewritten_heldout, heldout)
    if not train_set or not heldout:
        raise ValueError(f"{settings.shards} data shards leave no training or held-out sequences: use --shards 2 or more")
    return train_set, heldout


# ---------------------------------------------------------------- the command line


def add_run_arguments(p: argparse.ArgumentParser, d: RunSettings, what: str):
    """The options of RunSettings, the same flags in both trainers; `what` names the output
    ("head", "heads"). `d` gives the defaults. Returns the "training" group, for the trainer's own
    options."""
    plural = what.endswith("s")
    owner = f"{what}'" if plural else f"{what}'s"
    p.add_argument("--preset", required=True, help=f"the preset whose target the {what} {'draft' if plural else 'drafts'} for")
    p.add_argument("--out", required=True, help=f"the {what} folder to write (new, empty, or an unfinished run's)")
    p.add_argument("--config", help="a models.yaml other than the bundled one")
    data = p.add_argument_group("self-distilled data (the same shards serve the EAGLE and the Medusa trainer)")
    data.add_argument("--work", help="data shards and checkpoints (default OUT/train_work; the other trainer's work "
                                     "folder shares its data); rerun to resume")
    data.add_argument("--seed", type=int, default=d.seed)
    data.add_argument("--shards", type=int, default=d.shards, help=f"data shards to generate and use ({d.per_shard} prompts each)")
    data.add_argument("--per-shard", type=int, default=d.per_shard)
    data.add_argument("--gen-batch", type=int, default=d.gen_batch, help="prompts per batched generate")
    data.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="reply length cap in the data")
    data.add_argument("--passages", choices=PASSAGE_SOURCES, default=d.passages,
                      help="passages of the summarize / answer-from / translate prompts: the target's own writing, "
                           "or half of them human prose (Python's reference documentation)")
    data.add_argument("--prompts", choices=PROMPT_SOURCES, default=d.prompts,
                      help="the prompt source: template prompts, or a varied mix (pasted prose and code, requests and "
                           "second turns the target writes itself; see docs/training.md)")
    data.add_argument("--data-dtype", choices=["target", *sorted(DATA_DTYPES)], default=d.data_dtype,
                      help="what writes the data: the target as it decodes, or its weights in bf16 (faster on CPUs with AMX)")
    data.add_argument("--rewrite-heldout", type=int, metavar="N",
                      help="with --data-dtype other than target: the target writes only the first N held-out shards "
                           "again, and the head is measured on those (default: all; the others stay out of training)")
    data.add_argument("--data-only", action="store_true", help="write the data shards and stop (rerun to resume)")
    run = p.add_argument_group("training")
    run.add_argument("--train-dtype", choices=sorted(TRAIN_DTYPES), default=d.train_dtype,
                     help=f"what the {owner} matmuls run in while training (bfloat16: autocast, faster on CPUs with AMX)")
    run.add_argument("--epochs", type=int, default=d.epochs)
    run.add_argument("--batch", type=int, default=d.batch, help="sequences per optimizer step")
    run.add_argument("--lr", type=float, default=d.lr)
    run.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, help="steps")
    run.add_argument("--save-dtype", choices=sorted(SAVE_DTYPES), default=d.save_dtype)
    run.add_argument("--max-minutes", type=float, help=f"stop training after this long and write the {what}")
    run.add_argument("--threads", type=int, help="torch threads")
    return run


# The counts RunSettings holds that must be at least 1; each trainer adds its own.
POSITIVE = ("shards", "per_shard", "gen_batch", "max_new_tokens", "epochs", "batch")


def run_command(parser: argparse.ArgumentParser, argv: list[str], settings_type: type, train_run, positive: tuple[str, ...],
                result: Callable[[dict], str]) -> int:
    """A trainer's command: its settings from the parsed command line (which the output's README
    records), the run, and one line of what it wrote; a bad option or folder is a one-line error.
    `positive`: the trainer's own counts that must be at least 1; `result(summary)`: what the
    line says of a finished run."""
    args = parser.parse_args(argv)

    def command() -> int:
        for name in (*POSITIVE, *positive, "rewrite_heldout"):
            if getattr(args, name) is not None and getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if args.rewrite_heldout is not None and args.data_dtype == "target":
            raise ValueError("--rewrite-heldout needs --data-dtype other than target (the target wrote every shard already)")
        settings = settings_type(**vars(args), command=shlex.join([*parser.prog.split(), *argv]))
        summary = train_run(settings)
        if settings.data_only:
            inform(f"wrote the data shards in {settings.work_dir / 'data'}")
        else:
            inform(f"wrote {settings.out}: {result(summary)}")
        return 0

    return run_guarded(command)


def keep_freed_memory() -> None:
    """Let glibc's malloc keep freed memory for the next allocation. By default it maps each
    allocation over its threshold (at most 32 MB) fresh from the kernel and unmaps it when freed,
    so every large tensor of a step (the [rows, vocabulary] logits: 50 MB) is faulted in and
    zeroed again, step after step. A trainer's steps allocate alike, so keeping the memory in the
    heap costs no more of it: the EAGLE trainer's real-data steps went from 937-1,147 to
    1,249-1,263 trained positions a second (the same 24 steps, three paired runs, 2 cores). Set
    by the trainers' entry points (python -m specdec_core.train_eagle / train_medusa) for their
    own process only, not by main(), which tests call in theirs; not glibc: nothing changes."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    libc.mallopt(m_mmap_max, 0)  # no allocation mapped apart: all in the heap
    libc.mallopt(m_trim_threshold, 2**31 - 1)  # and the heap's free top never handed back
