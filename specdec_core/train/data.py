"""Self-distilled training data: the target's own replies to the trainer's prompts.

Replies come from batched `model.generate` with left padding (far faster than one at a time on
a CPU), through the target's chat template, greedy or sampled (temperature 0.7 or 1.0, no top-k
or top-p) by batch. The data is written in shards (`shard-00000.jsonl`, one JSON object per
line: family, mode, prompt_ids, reply_ids) with the target's features beside it
(`shard-00000.pt`: for each sequence, aux [n-1, 3H] and final [n-1, H] fp16, captured with hooks
during generation itself, so no second target pass is needed). Each is written whole and then
renamed into place, the .jsonl last, so a crash loses at most the shard in progress and a rerun
continues after the last full shard.
Shard i > 0 also holds prompts built on passages the target wrote in shard i-1 (summarize,
answer from it, translate it), so those families read the target's own text. With
`passages="mixed"`, half of those passages are human prose instead (train.passages).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..chat import chat_prompt_ids
from .features import capture_features
from .passages import passage_pool
from .prompts import Prompt, derived_prompts, direct_prompts

# Greedy replies are what greedy acceptance is measured on; sampled ones widen what the head sees.
MODES = ("greedy", "t0.7", "greedy", "t1.0")
PASSAGE_TOKENS = 160  # a passage longer than this is cut (at a sentence end when there is one)
PASSAGE_SOURCES = ("target", "mixed")  # passages the target wrote; half of them human prose instead
SETTINGS_FILE = "data_settings.json"  # what a folder's shards were written with


@dataclass(frozen=True)
class DataSettings:
    shards: int
    per_shard: int = 32
    batch_size: int = 32
    max_new_tokens: int = 192
    seed: int = 0
    passages: str = "target"  # one of PASSAGE_SOURCES


def shard_path(data_dir: Path, index: int) -> Path:
    return Path(data_dir) / f"shard-{index:05d}.jsonl"


def features_path(data_dir: Path, index: int) -> Path:
    return Path(data_dir) / f"shard-{index:05d}.pt"


def read_shard(path: Path) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def complete_shards(data_dir: Path, count: int) -> list[Path]:
    """The first `count` shards that are on disk (in order, stopping at the first gap)."""
    paths = []
    for index in range(count):
        path = shard_path(data_dir, index)
        if not path.exists():
            break
        paths.append(path)
    return paths


def generate_data(
    model_factory: Callable[[], object],
    tokenizer,
    data_dir: Path,
    settings: DataSettings,
    layer_ids: tuple[int, ...],
    progress: Callable[[int, int], None] | None = None,
    indices: list[int] | None = None,
    out_dir: Path | None = None,
    writer: str = "target",
) -> list[Path]:
    """Write shards `indices` (default 0..settings.shards-1) that are not on disk yet; return their
    paths. `model_factory()` gives the model that writes them, called only when a shard is missing.
    With `out_dir`, shards of `data_dir` are written again there by another model: the same
    prompts (those over passages read from data_dir's shard before), modes and seeds. `writer`
    names the model that writes (the target, or its weights in another dtype); a folder whose
    shards were written with other settings or by another writer is refused (ValueError)."""
    data_dir = Path(data_dir)
    out_dir = Path(out_dir) if out_dir is not None else data_dir
    indices = list(range(settings.shards)) if indices is None else indices
    out_dir.mkdir(parents=True, exist_ok=True)
    _claim(out_dir, {**asdict(settings), "layer_ids": list(layer_ids), "writer": writer})
    model = None
    for done, index in enumerate(indices, start=1):
        path = shard_path(out_dir, index)
        if not path.exists():
            model = model if model is not None else model_factory()
            previous = read_shard(shard_path(data_dir, index - 1)) if index else []
            prompts = _shard_prompts(index, previous, tokenizer, settings)
            rows, features = _generate_shard(model, tokenizer, prompts, index, settings, layer_ids)
            temporary = features_path(out_dir, index).with_suffix(".pt.tmp")
            torch.save(features, temporary)
            os.replace(temporary, features_path(out_dir, index))
            _write_atomically(path, rows)
        if progress:
            progress(done, len(indices))
    return [shard_path(out_dir, index) for index in indices]


def _claim(out_dir: Path, recipe: dict) -> None:
    """Record the recipe of a new folder's shards, or check an old folder's against it: a rerun
    with another --passages, --seed or reply length would otherwise add shards of another recipe
    beside the old ones, and train on both without a word. The shard count may grow."""
    recipe = {k: v for k, v in recipe.items() if k != "shards"}
    path = out_dir / SETTINGS_FILE
    if path.exists():
        refuse_other_settings(read_shard(path)[0], recipe, f"{out_dir} holds data shards written")
    elif not any(out_dir.glob("shard-*.jsonl")):  # a folder from before the record: left unchecked
        _write_atomically(path, [recipe])


def refuse_other_settings(recorded: dict, wanted: dict, holder: str) -> None:
    """Raise a one-line ValueError naming the settings in which `recorded` differs from `wanted`."""
    changed = sorted(k for k in wanted if recorded.get(k) != wanted[k])
    if changed:
        raise ValueError(f"{holder} with other settings ({', '.join(changed)}): rerun with them, or give another --work")


def _shard_prompts(index: int, previous: list[dict], tokenizer, settings: DataSettings) -> list[Prompt]:
    """Prompts over up to a third of the shard from the last shard's writing replies, the rest direct."""
    derived = passage_prompts(index, previous, tokenizer, settings)
    direct = direct_prompts(settings.per_shard - len(derived), seed=settings.seed * 1_000_003 + index)
    return derived + direct


def held_out_shards(count: int) -> set[int]:
    return {i for i in range(count) if i % 10 == 8} or {count - 1}


def passage_prompts(index: int, previous: list[dict], tokenizer, settings: DataSettings) -> list[Prompt]:
    """Shard `index`'s prompts over passages (up to a third of the shard): from the previous
    shard's writing replies, and with `passages="mixed"` as many human ones (held-out shards
    draw them from the held-out pool). The held-out split rebuilds them to keep the held-out
    shards' passages out of training."""
    share = settings.per_shard // 3
    written = share if settings.passages == "target" else share // 2
    passages = [
        (row.get("topic", ""), _passage(tokenizer, row["reply_ids"]))
        for row in previous
        if row["family"] == "writing" and len(row["reply_ids"]) >= 40
    ][:written]
    seed = settings.seed * 1_000_003 + index
    if settings.passages == "mixed":
        pool = passage_pool(held_out=index in held_out_shards(settings.shards))
        passages += random.Random(seed).sample(pool, min(share - len(passages), len(pool)))
    return derived_prompts(passages, seed=seed)


def _passage(tokenizer, reply_ids: list[int]) -> str:
    text = tokenizer.decode(reply_ids[:PASSAGE_TOKENS], skip_special_tokens=True)
    if len(reply_ids) > PASSAGE_TOKENS and "." in text:
        text = text[: text.rfind(".") + 1]
    return text


def _generate_shard(
    model, tokenizer, prompts: list[Prompt], index: int, settings: DataSettings, layer_ids: tuple[int, ...]
) -> tuple[list[dict], list[dict]]:
    encoded = [chat_prompt_ids(tokenizer, [{"role": "user", "content": p.text}]) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))  # similar lengths pad less
    rows, features = [], []
    for batch_number, start in enumerate(range(0, len(order), settings.batch_size)):
        batch = order[start : start + settings.batch_size]
        mode = MODES[(index * 7 + batch_number) % len(MODES)]
        seed = settings.seed * 1_000_003 + index * 101 + batch_number
        replies, batch_features = _generate_batch(
            model, tokenizer, [encoded[i] for i in batch], mode, seed, settings.max_new_tokens, layer_ids
        )
        for i, reply, feature in zip(batch, replies, batch_features):
            rows.append(
                {"family": prompts[i].family, "topic": prompts[i].topic, "mode": mode,
                 "prompt_ids": encoded[i], "reply_ids": reply}
            )
            features.append(feature)
    return rows, features


@torch.no_grad()
def _generate_batch(
    model, tokenizer, prompts: list[list[int]], mode: str, seed: int, max_new_tokens: int, layer_ids: tuple[int, ...]
) -> tuple[list[list[int]], list[dict]]:
    """The target's replies to a batch of prompts, left-padded, each cut after its first eos,
    and each sequence's features: {"aux": [n-1, 3H], "final": [n-1, H]} for its n = prompt +
    reply tokens (the last token is never fed to the target, and no label needs it)."""
    eos = _eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    sampling = {"do_sample": False} if mode == "greedy" else {"do_sample": True, "temperature": float(mode[1:]), "top_k": 0, "top_p": 1.0}
    torch.manual_seed(seed)
    with capture_features(model, layer_ids) as calls:
        output = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
            eos_token_id=eos, pad_token_id=pad, repetition_penalty=1.0, **sampling,
        )
    # Column c of the concatenated calls is what the target read at step c: the padded prompt,
    # then each generated token but the last.
    aux = torch.cat([call[0] for call in calls], dim=1)
    final = torch.cat([call[1] for call in calls], dim=1)
    replies, features = [], []
    for b, row in enumerate(output[:, width:].tolist()):
        cut = next((i + 1 for i, token in enumerate(row) if token in eos), len(row))
        replies.append(row[:cut])
        first = width - len(prompts[b])
        last = width + cut - 1  # positions 0 .. n-2 of the sequence
        features.append({"aux": aux[b, first:last].clone(), "final": final[b, first:last].clone()})
    return replies, features


def _eos_ids(model, tokenizer) -> list[int]:
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured] if configured is not None else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _write_atomically(path: Path, rows: list[dict]) -> None:
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    os.replace(temporary, path)
