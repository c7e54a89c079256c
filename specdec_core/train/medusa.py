"""Train Medusa heads for a preset's target, with the target frozen (Medusa-1), on the EAGLE
trainer's self-distilled data: the same shards (each sequence's final hidden state `final` is
all the heads read), the same held-out split, checkpoints that resume, the same seed rules.

Head i at position t learns the token at t + 2 + i of the target's own reply (cross-entropy on
that token; the target's lm_head at t gives t + 1). The heads' blocks start as the identity
(Medusa's start: zero weights) and read out through the target's lm_head, which stays frozen and
is not saved: the folder holds only the blocks (Medusa's layout without output layers). The
readout is restricted to the tokens most frequent in the training replies (`--train-vocab`: a
sixth of the lm_head for SmolLM2, which is most of a step's cost), and the folder keeps them as
the heads' draft vocabulary (draft_vocab.json): the drafter reads out over the same rows, and so
does every measurement here.

Measured on the held-out greedy replies: each head's top-1 and top-k accuracy (its k best
guesses hold the token), and the chain the drafter proposes (the heads' top-1 guesses in a
row): acceptance by position and mean accepted per round.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..drafters.eagle_head import default_layer_ids
from ..drafters.medusa_heads import DRAFT_VOCAB_FILE, WEIGHTS_FILE, MedusaHeads
from ..presets.loading import load_preset
from .base import SAVE_DTYPES, RunSettings, load_split, write_data
from .dataset import Sequence, draft_vocabulary
from .loop import train_loop
from .outputs import DATA_WRITERS, check_out

CHECKPOINT = "medusa_checkpoint.pt"  # beside the EAGLE trainer's, in a work folder both may share
OURS = {"config.json", WEIGHTS_FILE, "training.json", "README.md", "train_work"}


@dataclass(frozen=True)
class MedusaSettings(RunSettings):
    """Medusa heads' run: the EAGLE trainer's data recipe and training settings, and the heads' own."""

    heads: int = 3
    layers: int = 1  # residual blocks per head
    train_vocab: int = 8192  # readout rows while training (see the module)
    top_k: int = 5  # of the top-k accuracy


def train_medusa(settings: MedusaSettings, stop_after: int | None = None) -> dict | None:
    """Run (or continue) the whole training; the summary written to training.json, or None when
    `stop_after` steps were reached first (how tests stand in for a killed run) or with
    `data_only` once the data is written."""
    out = Path(settings.out)
    check_out(out, OURS)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    loaded = load_preset(settings.preset, settings.config, load_draft=False, load_eagle=False, load_medusa=False, compile=False)
    target, tokenizer = loaded.target, loaded.tokenizer
    target.requires_grad_(False)
    text_config = target.config.get_text_config()
    started = time.monotonic()
    # The EAGLE head's feature layers: the data folder records them, so either trainer's shards
    # serve both (Medusa reads only the last hidden state, which every shard holds).
    write_data(settings, target, tokenizer, default_layer_ids(text_config.num_hidden_layers))
    data_seconds = time.monotonic() - started
    if settings.data_only:
        return None
    train_set, heldout = load_split(settings, tokenizer)
    evaluation = [s for s in heldout if s.mode == "greedy"] or heldout
    lm_head = target.get_output_embeddings().weight.detach().float()
    vocabulary = torch.tensor(draft_vocabulary(train_set, settings.train_vocab, text_config.vocab_size))
    readout = lm_head[vocabulary]
    to_readout = torch.full((text_config.vocab_size,), -100, dtype=torch.long)
    to_readout[vocabulary] = torch.arange(len(vocabulary))

    heads = new_heads(settings, text_config, str(loaded.preset.target.label))
    heads.draft_token_ids = vocabulary.tolist()  # what they guess among: saved with them, read out so when drafting
    optimizer = torch.optim.AdamW(heads.parameters(), lr=settings.lr, weight_decay=0.0)
    per_epoch = math.ceil(len(train_set) / settings.batch)

    def step(index: int):
        loss, positions = heads_loss(heads, readout, to_readout, _batch(train_set, settings, index, per_epoch))
        return loss, positions, {}

    def evaluate():
        point = accuracy(heads, lm_head, evaluation, settings.top_k)
        return point, f"held-out top-1 accuracy by head {point['top1']}"

    progress = train_loop(settings, heads, optimizer, settings.work_dir / CHECKPOINT, per_epoch, step, evaluate,
                          stop_after=stop_after)
    if progress is None:
        return None

    heads.save(out, dtype=SAVE_DTYPES[settings.save_dtype])
    saved = MedusaHeads.load(out).float()  # the numbers are those of the folder as written
    summary = {
        "preset": settings.preset,
        "command": settings.command,
        "settings": settings.fingerprint(),
        "head_parameters": saved.parameter_count,
        "data": {"train_sequences": len(train_set), "train_reply_tokens": sum(s.reply_tokens for s in train_set),
                 "heldout_sequences": len(heldout), "evaluated_sequences": len(evaluation),
                 "evaluated_modes": sorted({s.mode for s in evaluation}),
                 "generation_seconds_this_run": round(data_seconds, 1)},
        "training": {"steps": progress.step, "planned_steps": per_epoch * settings.epochs, "epochs": progress.step / per_epoch,
                     "positions": progress.tokens, "seconds": round(progress.seconds, 1),
                     "stopped_early": progress.stopped_early, "threads": torch.get_num_threads()},
        "learning_curve": progress.history,
        "heldout": accuracy(saved, lm_head, evaluation, settings.top_k),
    }
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "README.md").write_text(readme(summary))
    return summary


def new_heads(settings: MedusaSettings, text_config, base_model: str) -> MedusaHeads:
    """Heads that start as the identity (zero block weights, as Medusa starts), read out through
    the target's lm_head."""
    torch.manual_seed(settings.seed)
    heads = MedusaHeads(settings.heads, settings.layers, text_config.hidden_size, None, base_model)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.zero_()
    return heads


def _batch(train_set: list[Sequence], settings: MedusaSettings, step: int, per_epoch: int) -> list[Sequence]:
    """Step `step`'s sequences: a seeded shuffle per epoch, cut into batches."""
    epoch, index = divmod(step, per_epoch)
    order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(settings.seed * 7919 + epoch)).tolist()
    return [train_set[i] for i in order[index * settings.batch : (index + 1) * settings.batch]]


def head_targets(sequences: list[Sequence], head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, labels) for head `head` over the sequences' concatenated `final` rows: position t
    of a sequence is labelled with its token t + 2 + head, where that is a reply token."""
    rows, labels, offset = [], [], 0
    for s in sequences:
        n = len(s.ids)
        t = torch.arange(max(s.reply_start - 2 - head, 0), n - 2 - head)
        rows.append(offset + t)
        labels.append(s.ids[t + 2 + head])
        offset += len(s.final)
    return torch.cat(rows), torch.cat(labels)


def heads_loss(heads: MedusaHeads, readout: torch.Tensor, to_readout: torch.Tensor, sequences: list[Sequence]):
    """(the heads' summed cross-entropy over the restricted readout, positions trained at head 0)."""
    final = torch.cat([s.final.float() for s in sequences])  # fp16 rows: autocast's cat refuses to mix them
    states = heads.hidden(final)
    loss, positions = 0.0, 0
    for i in range(heads.num_heads):
        rows, labels = head_targets(sequences, i)
        logits = states[i, rows] @ readout.T
        loss = loss + torch.nn.functional.cross_entropy(logits.float(), to_readout[labels], ignore_index=-100)
        positions = positions or len(rows)
    return loss, positions


@torch.no_grad()
def accuracy(heads: MedusaHeads, lm_head: torch.Tensor, sequences: list[Sequence], top_k: int) -> dict:
    """Each head's held-out top-1 and top-k accuracy, read out as the drafter reads out (over the
    heads' draft vocabulary, or the whole lm_head `lm_head` [V, H] without one), and the chain of
    the heads' top-1 guesses: acceptance by position (a position counts only when the heads
    before it were right too) and mean accepted per round."""
    heads.eval()
    ids = torch.tensor(heads.draft_token_ids) if heads.draft_token_ids is not None else torch.arange(len(lm_head))
    readout = lm_head[ids]
    hits1 = [0] * heads.num_heads
    hitsk = [0] * heads.num_heads
    counts = [0] * heads.num_heads
    chains = 0
    accepted = [0] * heads.num_heads
    for s in sequences:
        states = heads.hidden(s.final.float())  # [K, n-1, H]
        n = len(s.ids)
        starts = torch.arange(max(s.reply_start - 2, 0), n - 2)  # chains whose first guess is a reply token
        right = torch.zeros(heads.num_heads, len(starts), dtype=torch.bool)
        for i in range(heads.num_heads):
            guesses = ids[(states[i, starts] @ readout.T).topk(top_k, dim=-1).indices]
            reach = starts + 2 + i < n
            labels = s.ids[(starts + 2 + i).clamp(max=n - 1)]
            top1, topk = guesses[:, 0] == labels, (guesses == labels[:, None]).any(-1)
            hits1[i] += int((top1 & reach).sum())
            hitsk[i] += int((topk & reach).sum())
            counts[i] += int(reach.sum())
            right[i] = top1 & reach
        chains += len(starts)
        alive = torch.ones(len(starts), dtype=torch.bool)
        for i in range(heads.num_heads):
            alive &= right[i]
            accepted[i] += int(alive.sum())
    by_position = [round(a / max(chains, 1), 4) for a in accepted]
    return {"top1": [round(h / max(c, 1), 4) for h, c in zip(hits1, counts)],
            f"top{top_k}": [round(h / max(c, 1), 4) for h, c in zip(hitsk, counts)],
            "top_k": top_k, "positions": counts, "chains": chains,
            "chain_by_position": by_position, "mean_accepted": round(sum(by_position), 4)}


def readme(summary: dict) -> str:
    """The heads' README: how they were trained, on what, and how well they guess held-out replies."""
    s, data, training, final = summary["settings"], summary["data"], summary["training"], summary["heldout"]
    k = final["top_k"]
    heads = range(1, s["heads"] + 1)
    lines = [
        f"# Medusa heads for preset `{summary['preset']}`",
        "",
        f"Trained by this project's Medusa trainer (target frozen); the folder is in Medusa's format: config.json "
        f"(medusa_num_heads {s['heads']}, medusa_num_layers {s['layers']}) and {WEIGHTS_FILE} with each head's residual "
        f"blocks. The heads read out through the target's own lm_head (no output layers in the file), over the "
        f"{s['train_vocab']:,} tokens they were trained to guess among ({DRAFT_VOCAB_FILE}: the rows the drafter reads).",
        "",
        "## Training command",
        "",
        "```bash",
        summary["command"] or f"python -m specdec_core.train_medusa --preset {summary['preset']} --out DIR",
        "```",
        "",
        "## Data and recipe",
        "",
        f"The EAGLE trainer's self-distilled data (docs/training.md): the target's own replies to {s['shards']} shards x "
        f"{s['per_shard']} offline prompts, at most {s['max_new_tokens']} new tokens; written by "
        f"{DATA_WRITERS[s['data_dtype']]}. {data['train_sequences']} training sequences "
        f"({data['train_reply_tokens']:,} reply tokens); held out: every tenth shard"
        + (", written again by the target itself" if s["data_dtype"] != "target" else "")
        + f", {data['evaluated_sequences']} replies measured ({', '.join(data['evaluated_modes'])}).",
        "",
        f"Head i at position t learns the reply token at t + 1 + i (cross-entropy, readout restricted to the "
        f"{s['train_vocab']:,} most frequent reply tokens while training); AdamW, lr {s['lr']} (warm-up, cosine), "
        f"{s['batch']} sequences per step, seed {s['seed']}. {training['steps']} of {training['planned_steps']} steps "
        f"({training['epochs']:.2f} epochs) in {training['seconds'] / 60:.1f} minutes on {training['threads']} thread(s)"
        + (" (stopped by --max-minutes)." if training["stopped_early"] else "."),
        "",
        f"## Held-out accuracy (over the draft vocabulary, as the drafter reads out; weights as saved: {s['save_dtype']})",
        "",
        "| head (token after the next) | " + " | ".join(f"{i}" for i in heads) + " |",
        "|---" * (s["heads"] + 1) + "|",
        "| top-1 | " + " | ".join(f"{a:.3f}" for a in final["top1"]) + " |",
        f"| top-{k} | " + " | ".join(f"{a:.3f}" for a in final[f"top{k}"]) + " |",
        "| chain acceptance (heads 1..i all right) | " + " | ".join(f"{a:.3f}" for a in final["chain_by_position"]) + " |",
        "",
        f"Mean accepted per round of the chain of top-1 guesses: {final['mean_accepted']:.3f} draft tokens "
        f"(over {final['chains']:,} chains, one at every reply position; the target's bonus token not counted).",
        "",
    ]
    return "\n".join(lines)
