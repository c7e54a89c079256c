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

import contextlib
import math
import os
import pickle
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..drafters.eagle_head import Eagle3Head, default_layer_ids
from ..presets.loading import load_plain_target, load_preset
from .data import DataSettings, generate_data, refuse_other_settings
from .dataset import Sequence, coverage, draft_vocabulary, held_out_shards, load_sequences, make_batch, same_prompts
from .outputs import check_out, write_outputs
from .ttt import Acceptance, measure_acceptance, ttt_loss

CHECKPOINT = "checkpoint.pt"
DATA_DTYPES = {"bfloat16": torch.bfloat16}  # besides "target"
TRAIN_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}  # None: no autocast
SAVE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# With --data-dtype other than "target", the held-out shards written again by the target itself:
# the head is measured on the replies its user gets.
HELDOUT_BY_TARGET = "heldout_by_target"
EVAL_FRACTIONS = (0.25, 0.5)  # of the first epoch, besides every epoch's end: the learning curve


@dataclass(frozen=True)
class TrainSettings:
    preset: str
    out: str
    config: str | None = None  # a models.yaml other than the bundled one
    work: str | None = None  # data shards and checkpoints; default OUT/train_work
    seed: int = 0
    shards: int = 40  # data shards of `per_shard` prompts each
    per_shard: int = 32
    gen_batch: int = 32
    max_new_tokens: int = 192
    passages: str = "target"  # what summarize / answer-from / translate prompts read (data.PASSAGE_SOURCES)
    prompts: str = "templates"  # the prompt source (data.PROMPT_SOURCES): prompts.py, or varied.py's mix
    # What writes the data: "target" (the target as it decodes) or "bfloat16" (its weights in bf16
    # on stock layers, see data_model: faster on CPUs with bf16 matrix units).
    data_dtype: str = "target"
    draft_vocab: int = 8192
    # What the head's matmuls run in while training: "bfloat16" autocasts them (weights, optimizer
    # and loss stay fp32): on a CPU with AMX its matmuls run 4x faster and a whole step about 1.45x.
    train_dtype: str = "float32"
    ttt_steps: int = 3  # unrolled draft steps in training
    epochs: int = 3
    batch: int = 8  # sequences per optimizer step
    lr: float = 1e-3
    checkpoint_every: int = 25
    k: int = 4  # draft length of the acceptance measurement
    save_dtype: str = "float16"
    max_minutes: float | None = None  # stop training (and write the head) after this long
    threads: int | None = None
    data_only: bool = False  # write the data shards and stop (no training, no head)
    command: str = ""  # the command line, for the head's README

    # What may change between a run and its resumption without changing the result.
    RESUMABLE = ("out", "work", "max_minutes", "threads", "command", "checkpoint_every", "data_only")

    def fingerprint(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in self.RESUMABLE}

    @property
    def rewrites_heldout(self) -> bool:
        """Whether the held-out shards are written again by the target (see HELDOUT_BY_TARGET)."""
        return self.data_dtype != "target"

    @property
    def work_dir(self) -> Path:
        return Path(self.work) if self.work else Path(self.out) / "train_work"

    @property
    def data_settings(self) -> DataSettings:
        return DataSettings(self.shards, self.per_shard, self.gen_batch, self.max_new_tokens, self.seed, self.passages,
                            self.prompts)


@dataclass
class Progress:
    """What a checkpoint holds besides the weights."""

    step: int = 0
    tokens: int = 0  # reply positions trained at draft step 1 so far (with repeats over epochs)
    seconds: float = 0.0  # training time so far, over all resumptions
    history: list[dict] = field(default_factory=list)  # held-out acceptance at evaluation points
    stopped_early: bool = False


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
    work = settings.work_dir
    data_dir = work / "data"
    with tqdm(total=settings.shards, desc="data shards", unit="shard") as bar:
        generate_data(lambda: data_model(settings, target), tokenizer, data_dir, settings.data_settings, layer_ids,
                      progress=lambda done, total: bar.update(done - bar.n), writer=settings.data_dtype, report=bar.write)
    if settings.rewrites_heldout:
        held = sorted(held_out_shards(settings.shards))
        with tqdm(total=len(held), desc="held-out shards by the target", unit="shard") as bar:
            generate_data(lambda: target, tokenizer, data_dir, settings.data_settings, layer_ids,
                          progress=lambda done, total: bar.update(done - bar.n), indices=held, out_dir=work / HELDOUT_BY_TARGET,
                          report=bar.write)
    data_seconds = time.monotonic() - started
    if settings.data_only:
        return None
    train_set, heldout = load_split(settings, tokenizer)
    if not train_set or not heldout:
        raise ValueError(f"{settings.shards} data shards leave no training or held-out sequences: use --shards 2 or more")
    vocabulary = draft_vocabulary(train_set, settings.draft_vocab, text_config.vocab_size)

    head = _new_head(target, text_config, vocabulary, layer_ids, settings.seed)
    embedding = target.get_input_embeddings()
    lm_head = target.get_output_embeddings().weight.detach().float()
    draft_lm_head = lm_head[torch.tensor(vocabulary)]
    optimizer = torch.optim.AdamW(head.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    per_epoch = math.ceil(len(train_set) / settings.batch)
    total_steps = per_epoch * settings.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(total_steps))
    progress = _resume(work, settings, head, optimizer, scheduler)
    evaluation = evaluation_set(heldout, lm_head)
    eval_steps = sorted({max(1, round(per_epoch * f)) for f in EVAL_FRACTIONS} | {per_epoch * e for e in range(1, settings.epochs + 1)})

    bar = tqdm(total=total_steps, initial=progress.step, desc="training", unit="step")
    head.train()
    resumed_at = time.monotonic() - progress.seconds
    while progress.step < total_steps and not _out_of_time(settings, progress):
        sequences = _batch_sequences(train_set, settings, progress.step, per_epoch)
        with _autocast(settings.train_dtype):
            loss, report = ttt_loss(head, embedding, draft_lm_head, make_batch(sequences, settings.ttt_steps), settings.ttt_steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        progress.step += 1
        progress.tokens += report.get(1, (0, 0, 0))[2]
        progress.seconds = time.monotonic() - resumed_at
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", agree1=f"{report.get(1, (0, 0))[1]:.3f}")
        if progress.step in eval_steps:
            point = acceptance(head, embedding, evaluation, settings).as_dict()
            progress.history.append({"step": progress.step, "tokens": progress.tokens, "epoch": progress.step / per_epoch, **point})
            head.train()
            bar.write(f"step {progress.step}: held-out acceptance {point['by_position']}, mean accepted {point['mean_accepted']}")
        out_of_time = progress.stopped_early = _out_of_time(settings, progress)
        if progress.step % settings.checkpoint_every == 0 or progress.step in eval_steps or out_of_time or progress.step == total_steps:
            _save_checkpoint(work, settings, head, optimizer, scheduler, progress)
        if stop_after is not None and progress.step >= stop_after and progress.step < total_steps:
            bar.close()
            return None
    bar.close()

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
        "training": {"steps": progress.step, "planned_steps": total_steps, "epochs": progress.step / per_epoch,
                     "tokens": progress.tokens, "seconds": round(progress.seconds, 1),
                     "stopped_early": progress.stopped_early, "threads": torch.get_num_threads()},
        "learning_curve": progress.history,
        "heldout_acceptance": final.as_dict(),
    }
    write_outputs(out, summary)
    return summary


def _out_of_time(settings: TrainSettings, progress: Progress) -> bool:
    return settings.max_minutes is not None and progress.seconds > settings.max_minutes * 60


def data_model(settings: TrainSettings, target):
    """The model that writes the data's replies and features. "bfloat16": the target's own weights
    in bf16 on stock layers, so batched generation runs on bf16 matrix units. For a 4-bit GGUF
    target those are its dequantised weights rounded to bf16: measured on SmolLM2-135M, its
    features differ from the 4-bit target's by 0.5-1% (relative norm at the inputs of layers 2,
    15 and 27) and its greedy replies to 12 prompts agreed with the target's for the first 6 to
    96 tokens (all 96 on 3, median 42.5)."""
    if settings.data_dtype == "target":
        return target
    return load_plain_target(settings.preset, settings.config, dtype=DATA_DTYPES[settings.data_dtype])


def _autocast(train_dtype: str):
    dtype = TRAIN_DTYPES[train_dtype]
    return torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()


def _new_head(target, text_config, vocabulary: list[int], layer_ids, seed: int) -> Eagle3Head:
    """A random head whose output norm and lm_head start as the target's own (restricted to the
    draft vocabulary): the head then first has to learn to predict the target's next hidden state."""
    head = Eagle3Head.random(target.config, draft_vocab_size=len(vocabulary), layer_ids=layer_ids, seed=seed)
    head.set_draft_vocab(vocabulary)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[torch.tensor(vocabulary)].float())
        norm = target.get_decoder().norm if hasattr(target, "get_decoder") else target.model.norm
        head.norm.weight.copy_(norm.weight.float())
    return head


def _schedule(total_steps: int):
    """Linear warm-up over 5% of the steps, then cosine down to 10% of the learning rate."""
    warmup = max(1, total_steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = (step - warmup) / max(1, total_steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))

    return factor


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


def load_split(settings: TrainSettings, tokenizer) -> tuple[list[Sequence], list[Sequence]]:
    """(training sequences, held-out sequences) of the work folder's data; the held-out ones
    written by the target itself (see HELDOUT_BY_TARGET)."""
    train_set, heldout = load_sequences(settings.work_dir / "data", settings.data_settings, tokenizer)
    if settings.rewrites_heldout:
        heldout = same_prompts(settings.work_dir / HELDOUT_BY_TARGET, held_out_shards(settings.shards), heldout)
    return train_set, heldout


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


def _resume(work: Path, settings: TrainSettings, head, optimizer, scheduler, name: str = CHECKPOINT) -> Progress:
    """The progress of the checkpoint `name` in `work` (loaded into head, optimizer, scheduler),
    or a fresh start when there is none. The Medusa trainer keeps its own checkpoint name, so both
    trainers can share one work folder (its data)."""
    path = work / name
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
    refuse_other_settings(state["settings"], settings.fingerprint(), f"{path} is a run")
    head.load_state_dict(state["head"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return Progress(**state["progress"])


def _save_checkpoint(work: Path, settings: TrainSettings, head, optimizer, scheduler, progress: Progress,
                     name: str = CHECKPOINT) -> None:
    work.mkdir(parents=True, exist_ok=True)
    state = {"settings": settings.fingerprint(), "head": head.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "progress": asdict(progress)}
    temporary = work / (name + ".tmp")
    torch.save(state, temporary)
    os.replace(temporary, work / name)
