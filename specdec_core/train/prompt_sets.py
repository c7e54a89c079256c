"""Heads measured on the target's replies to a set of prompts that no training shard holds:
the everyday prompts written for the check (data/everyday_prompts.jsonl), or a benchmark's
questions (evaluation only: the caller reads them; nothing here trains on them).

The target the preset runs writes its greedy replies once, its features captured on the way
(batch_generate, as the held-out shards are written again by the target), and they are kept in a
folder: every head is then measured on the very same replies, the way the trainer measures its
own held-out shards (trainer.evaluation_set and acceptance).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..chat import chat_prompt_ids
from .batch_generate import generate_batch
from .data import eos_ids, read_shard, write_rows
from .dataset import Sequence, rows_to_sequences

EVERYDAY_PROMPTS = Path(__file__).resolve().parent / "data" / "everyday_prompts.jsonl"


def everyday_prompts() -> list[tuple[str, str]]:
    """(category, prompt) of the everyday prompts written for the check."""
    rows = read_shard(EVERYDAY_PROMPTS)
    return [(row["category"], row["prompt"]) for row in rows]


def replies_to(
    name: str, prompts: list[tuple[str, str]], target, tokenizer, folder: Path, layer_ids: tuple[int, ...],
    max_new_tokens: int = 192, batch_size: int = 64,
) -> list[Sequence]:
    """The target's greedy replies to (family, prompt) pairs, as greedy Sequences with features
    (those at least 3 tokens long). Written into `folder` as NAME.jsonl and NAME.pt on the first
    call; a later call with the same prompts, layers and reply cap reads them back."""
    folder = Path(folder)
    rows_path, features_file = folder / f"{name}.jsonl", folder / f"{name}.pt"
    recipe = {"prompts": [list(p) for p in prompts], "layer_ids": list(layer_ids), "max_new_tokens": max_new_tokens}
    recipe_path = folder / f"{name}.recipe.json"
    if not (rows_path.exists() and features_file.exists() and _read_json(recipe_path) == recipe):
        folder.mkdir(parents=True, exist_ok=True)
        rows, features = _write_replies(prompts, target, tokenizer, layer_ids, max_new_tokens, batch_size)
        torch.save(features, features_file)
        write_rows(rows_path, rows)
        recipe_path.write_text(json.dumps(recipe))
    return rows_to_sequences(read_shard(rows_path), torch.load(features_file, weights_only=True))


def _write_replies(prompts, target, tokenizer, layer_ids, max_new_tokens: int, batch_size: int):
    encoded = [chat_prompt_ids(tokenizer, [{"role": "user", "content": text}]) for _, text in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))  # similar lengths pad less
    eos = eos_ids(target, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    rows, features = [None] * len(prompts), [None] * len(prompts)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        replies, batch_features = generate_batch(target, [encoded[i] for i in batch], max_new_tokens=max_new_tokens,
                                                 eos=eos, pad=pad, layer_ids=layer_ids)
        for i, reply, feature in zip(batch, replies, batch_features):
            rows[i] = {"family": prompts[i][0], "prompt_ids": encoded[i], "reply_ids": reply}
            features[i] = feature
    return rows, features


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
