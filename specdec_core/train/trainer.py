"""Train an EAGLE-3 head for a preset's target: data, draft vocabulary, training-time test,
checkpoints that resume, held-out acceptance, and the head folder in the EAGLE-3 format.

`train(settings)` runs every stage and skips what the work folder already holds: data shards
on disk are not generated again, and a checkpoint (written every `checkpoint_every` steps and at
every evaluation) is continued from, so killing the run and starting the same command again
carries on. The same settings and seed give the same head: the head's initialisation and the
order of batches come from the seed alone (and torch's CPU kernels are deterministic for a
given thread count).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..decoding.base import decoder_of
from ..drafters.eagle_head import Eagle3Head, default_layer_ids
from ..presets.loading import load_preset
from .base import SAVE_DTYPES, RunSettings, load_split, write_data
from .base import data_model  # noqa: F401 (named here before base.py: tests and scripts import it from here)
from .dataset import Sequence, coverage, draft_vocabulary, make_batch
from .loop import train_loop
from .outputs import check_out, write_outputs
from .ttt import Acceptance, measure_acceptance, ttt_loss

CHECKPOINT = "checkpoint.pt"
EVAL_FRACTIONS = (0.25, 0.5)  # of the first epoch, besides every epoch's end: the learning curve


@dataclass(frozen=True)
class TrainSettings(RunSettings):
    """An EAGLE-3 head's run: the shared data recipe and training settings, and the head's own."""

    draft_vocab: int = 8192
    ttt_steps: int = 3  # unrolled draft steps in training
    k: int = 4  # draft length of the acceptance measurement


def train(settings: TrainSettings, stop_after: int | None = None) -> dict | None:
    """Run (or continue) the whole training; returns the summary written to training.json, or
    None when `stop_after` steps were reached first (how tests stand in for a killed run) or
    with `data_only` once the data is written."""
    out = Path(settings.out)
    check_out(out)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    loaded = load_preset(settings.preset, settings.config, load_draft=False, compile=False)  # training runs no decoding steps
    target, tokenizer = loaded.target, loaded.tokenizer
    target.requires_grad_(False)
    text_config = target.config.get_text_config()
    layer_ids = default_layer_ids(text_config.num_hidden_layers)

    started = time.monotonic()
    write_data(settings, target, tokenizer, layer_ids)
    data_seconds = time.monotonic() - started
    if settings.data_only:
        return None
    train_set, heldout = load_split(settings, tokenizer)
    vocabulary = draft_vocabulary(train_set, settings.draft_vocab, text_config.vocab_size)

    head = _new_head(target, text_config, vocabulary, layer_ids, settings.seed)
    embedding = target.get_input_embeddings()
    lm_head = target.get_output_embeddings().weight.detach().float()
    draft_lm_head = lm_head[torch.tensor(vocabulary)]
    optimizer = torch.optim.AdamW(head.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    per_epoch = math.ceil(len(train_set) / settings.batch)
    evaluation = evaluation_set(heldout, lm_head)

    def step(index: int):
        sequences = _batch_sequences(train_set, settings, index, per_epoch)
        loss, report = ttt_loss(head, embedding, draft_lm_head, make_batch(sequences, settings.ttt_steps), settings.ttt_steps)
        return loss, report.get(1, (0, 0, 0))[2], {"agree1": f"{report.get(1, (0, 0))[1]:.3f}"}

    def evaluate():
        point = acceptance(head, embedding, evaluation, settings).as_dict()
        return point, f"held-out acceptance {point['by_position']}, mean accepted {point['mean_accepted']}"

    progress = train_loop(settings, head, optimizer, settings.work_dir / CHECKPOINT, per_epoch, step, evaluate,
                          eval_steps={max(1, round(per_epoch * f)) for f in EVAL_FRACTIONS}, stop_after=stop_after)
    if progress is None:
        return None

    # The numbers are those of the folder as written (fp16 weights), read back as a user would.
    head.save(out, dtype=SAVE_DTYPES[settings.save_dtype])
    saved = Eagle3Head.load(out, num_target_layers=text_config.num_hidden_layers).float()
    final = acceptance(saved, embedding, evaluation, settings)
    summary = {
        "preset": settings.preset,
        "command": settings.command,
        "settings": settings.fingerprint(),
        "target_layers": list(layer_ids),
        "head_parameters": saved.parameter_count,
        "data": _data_summary(train_set, heldout, evaluation, vocabulary, data_seconds),
        "training": {"steps": progress.step, "planned_steps": per_epoch * settings.epochs, "epochs": progress.step / per_epoch,
                     "tokens": progress.tokens, "seconds": round(progress.seconds, 1),
                     "stopped_early": progress.stopped_early, "threads": torch.get_num_threads()},
        "learning_curve": progress.history,
        "heldout_acceptance": final.as_dict(),
    }
    write_outputs(out, summary)
    return summary


def _new_head(target, text_config, vocabulary: list[int], layer_ids, seed: int) -> Eagle3Head:
    """A random head whose output norm and lm_head start as the target's own (restricted to the
    draft vocabulary): the head then first has to learn to predict the target's next hidden state."""
    head = Eagle3Head.random(target.config, draft_vocab_size=len(vocabulary), layer_ids=layer_ids, seed=seed)
    head.set_draft_vocab(vocabulary)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[torch.tensor(vocabulary)].float())
        head.norm.weight.copy_(decoder_of(target).norm.weight.float())
    return head


def _batch_sequences(train_set: list[Sequence], settings: TrainSettings, step: int, per_epoch: int) -> list[Sequence]:
    """The sequences of optimizer step `step`: a seeded shuffle per epoch, then groups of 16
    batches sorted by length (less padding), the batches of each epoch in seeded order."""
    epoch, index = divmod(step, per_epoch)
    generator = torch.Generator().manual_seed(settings.seed * 7919 + epoch)
    order = torch.randperm(len(train_set), generator=generator).tolist()
    group = settings.batch * 16
    order = [i for start in range(0, len(order), group) for i in sorted(order[start : start + group], key=lambda i: len(train_set[i].ids))]
    batches = [order[start : start + settings.batch] for start in range(0, len(order), settings.batch)]
    batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return [train_set[i] for i in batches[index]]


def evaluation_set(heldout: list[Sequence], lm_head: torch.Tensor) -> list[Sequence]:
    """Greedy held-out replies, each with the target's greedy token after every position: on a
    greedy reply that is the next token itself, which the target chose in the very forwards the
    features come from (chains only check reply positions). Sampled replies, with the greedy
    tokens from the target's logits, only when no greedy reply is held out (tiny runs)."""
    chosen = [s for s in heldout if s.mode == "greedy"] or heldout
    for s in chosen:
        s.greedy = s.ids[1:].clone() if s.mode == "greedy" else (s.final.float() @ lm_head.T).argmax(-1)
    return chosen


def acceptance(head, embedding, sequences: list[Sequence], settings: TrainSettings) -> Acceptance:
    head.eval()
    result = Acceptance(settings.k)
    for start in range(0, len(sequences), settings.batch):
        batch = make_batch(sequences[start : start + settings.batch], settings.k)
        measure_acceptance(head, embedding, batch, settings.k, result)
    return result


def _data_summary(train_set, heldout, evaluation, vocabulary, data_seconds: float) -> dict:
    families: dict[str, int] = {}
    for sequence in train_set:
        families[sequence.family] = families.get(sequence.family, 0) + 1
    return {
        "train_sequences": len(train_set),
        "train_reply_tokens": sum(s.reply_tokens for s in train_set),
        "train_tokens": sum(len(s.ids) for s in train_set),
        "heldout_sequences": len(heldout),
        "evaluated_sequences": len(evaluation),
        "modes": sorted({s.mode for s in train_set}),
        "families": dict(sorted(families.items())),
        "draft_vocab_size": len(vocabulary),
        "draft_vocab_coverage_train": round(coverage(train_set, vocabulary), 4),
        "draft_vocab_coverage_heldout": round(coverage(heldout, vocabulary), 4),
        "generation_seconds_this_run": round(data_seconds, 1),
    }
