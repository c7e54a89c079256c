"""Training sequences from the data shards: split, draft vocabulary, batches.

A sequence is one prompt + reply with the target's features at positions 0..n-2. Every tenth
shard (index 8, 18, ...: shards whose replies are greedy, see data.MODES; the last one when there
are fewer than nine) is held out for the acceptance measurement. Prompts of the next shard that were built on a held-out shard's passages
are left out of training, so no held-out reply is ever in the training data. The prompt source
repeats some topic x template pairs across shards; a held-out sequence whose prompt is also a
training prompt is left out of the measurement (its greedy reply is one the head trained on, and
the head drafts it better than it would a new one: in an earlier head's data, 35 of 192 held-out
replies).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from ..chat import chat_prompt_ids
from .data import DataSettings, features_path, held_out_shards, passage_prompts, read_shard, shard_path


@dataclass
class Sequence:
    ids: torch.Tensor  # [n] prompt + reply token ids
    aux: torch.Tensor  # [n-1, 3H] fp16: the residual stream entering the three feature layers
    final: torch.Tensor  # [n-1, H] fp16: the target's last hidden state (after its final norm)
    reply_start: int  # index of the first reply token
    mode: str  # "greedy" | "t0.7" | "t1.0"
    family: str
    greedy: torch.Tensor | None = None  # [n-1] the target's greedy token after each position (evaluation only)
    from_shard: int | None = None  # the shard whose replies its prompt builds on (varied prompts)

    @property
    def reply_tokens(self) -> int:
        return len(self.ids) - self.reply_start


def load_sequences(data_dir: Path, settings: DataSettings, tokenizer) -> tuple[list[Sequence], list[Sequence]]:
    """(training sequences, held-out sequences) from shards 0..settings.shards-1."""
    held = held_out_shards(settings.shards)
    train, heldout = [], []
    for index in range(settings.shards):
        # Varied prompts say which shard they build on; template ones are rebuilt to find out.
        rebuild = index - 1 in held and settings.prompts == "templates"
        leaked = _prompts_on(held_rows=read_shard(shard_path(data_dir, index - 1)), index=index, tokenizer=tokenizer,
                             settings=settings) if rebuild else set()
        for sequence in shard_sequences(data_dir, index):
            if index in held:
                heldout.append(sequence)
            elif _prompt(sequence) not in leaked and sequence.from_shard not in held:
                train.append(sequence)
    trained_prompts = {_prompt(sequence) for sequence in train}
    return train, [sequence for sequence in heldout if _prompt(sequence) not in trained_prompts]


def shard_sequences(data_dir: Path, index: int) -> list[Sequence]:
    """Shard `index`'s sequences that are long enough to hold a draft chain."""
    rows = read_shard(shard_path(data_dir, index))
    # mmap: the features stay in the file (the page cache) until a batch reads them, so data
    # larger than memory (2M reply tokens with their prompts: about 15-30 GB) can be trained on.
    features = torch.load(features_path(data_dir, index), weights_only=True, mmap=True)
    return rows_to_sequences(rows, features)


def rows_to_sequences(rows: list[dict], features: list[dict]) -> list[Sequence]:
    """Sequences of written rows (prompt_ids, reply_ids, family; mode, default greedy) and their
    features, those long enough to hold a draft chain."""
    sequences = [
        Sequence(ids=torch.tensor(row["prompt_ids"] + row["reply_ids"]), aux=feature["aux"], final=feature["final"],
                 reply_start=len(row["prompt_ids"]), mode=row.get("mode", "greedy"), family=row["family"],
                 from_shard=row.get("from_shard"))
        for row, feature in zip(rows, features, strict=True)
    ]
    return [sequence for sequence in sequences if sequence.reply_tokens >= 3]


def same_prompts(rewritten_dir: Path, indices, heldout: list[Sequence]) -> list[Sequence]:
    """The sequences of shards `indices` of `rewritten_dir` (the held-out shards written again by
    another model) whose prompts are those of `heldout` (so none is a training prompt)."""
    kept = {_prompt(sequence) for sequence in heldout}
    return [s for index in sorted(indices) for s in shard_sequences(rewritten_dir, index) if _prompt(s) in kept]


def _prompt(sequence: Sequence) -> tuple[int, ...]:
    return tuple(sequence.ids[: sequence.reply_start].tolist())


def _prompts_on(held_rows: list[dict], index: int, tokenizer, settings: DataSettings) -> set[tuple[int, ...]]:
    """The prompt ids shard `index` built on passages of the previous (held-out) shard."""
    prompts = passage_prompts(index, held_rows, tokenizer, settings)
    return {tuple(chat_prompt_ids(tokenizer, [{"role": "user", "content": p.text}])) for p in prompts}


def draft_vocabulary(sequences: list[Sequence], size: int, vocab_size: int) -> list[int]:
    """The `size` target tokens most frequent in the replies (ties by id), sorted by id; tokens
    never seen fill up from the lowest ids when the replies hold fewer distinct tokens."""
    counts = Counter()
    for sequence in sequences:
        counts.update(sequence.ids[sequence.reply_start :].tolist())
    size = min(size, vocab_size)
    chosen = [token for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:size]]
    taken = set(chosen)
    filler = (token for token in range(vocab_size) if token not in taken)
    while len(chosen) < size:
        chosen.append(next(filler))
    return sorted(chosen)


def coverage(sequences: list[Sequence], vocabulary: list[int]) -> float:
    """The share of reply tokens that are in the draft vocabulary."""
    inside = torch.zeros(max(vocabulary) + 1, dtype=torch.bool)
    inside[torch.tensor(vocabulary)] = True
    total = hits = 0
    for sequence in sequences:
        reply = sequence.ids[sequence.reply_start :]
        total += len(reply)
        hits += int(inside[reply.clamp(max=len(inside) - 1)].logical_and(reply < len(inside)).sum())
    return hits / max(total, 1)


@dataclass
class Batch:
    """Right-padded sequences. For draft step j (1-based) at chain start t, the head reads token
    ids[:, t + j] and is trained towards the target's distribution at position t + j."""

    ids: torch.Tensor  # [B, m + steps + 1]
    aux: torch.Tensor  # [B, m, 3H] fp16
    final: torch.Tensor  # [B, m + steps, H] fp16
    lengths: torch.Tensor  # [B] sequence lengths n
    reply_starts: torch.Tensor  # [B]
    greedy: torch.Tensor | None = None  # [B, m + steps] the target's greedy next tokens, when known

    @property
    def width(self) -> int:
        return self.aux.shape[1]


def make_batch(sequences: list[Sequence], steps: int) -> Batch:
    m = max(len(s.aux) for s in sequences)
    size, hidden = len(sequences), sequences[0].final.shape[-1]
    ids = torch.zeros(size, m + steps + 1, dtype=torch.long)
    aux = torch.zeros(size, m, sequences[0].aux.shape[-1], dtype=torch.float16)
    final = torch.zeros(size, m + steps, hidden, dtype=torch.float16)
    greedy = torch.full((size, m + steps), -1, dtype=torch.long) if all(s.greedy is not None for s in sequences) else None
    for b, s in enumerate(sequences):
        ids[b, : len(s.ids)] = s.ids
        aux[b, : len(s.aux)] = s.aux
        final[b, : len(s.final)] = s.final
        if greedy is not None:
            greedy[b, : len(s.greedy)] = s.greedy
    return Batch(
        ids=ids, aux=aux, final=final, greedy=greedy,
        lengths=torch.tensor([len(s.ids) for s in sequences]),
        reply_starts=torch.tensor([s.reply_start for s in sequences]),
    )
