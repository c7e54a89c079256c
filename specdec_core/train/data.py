"""Self-distilled training data: the target's own replies to the trainer's prompts.

Replies come from batched `model.generate` with left padding (far faster than one at a time on
a CPU), through the target's chat template, greedy or sampled (temperature 0.7 or 1.0, no top-k
or top-p) by batch. The data is written in shards (`shard-00000.jsonl`, one JSON object per
line: family, mode, prompt_ids, reply_ids) with the target's features beside it
(`shard-00000.pt`: for each sequence, aux [n-1, 3H] and final [n-1, H] fp16, captured with hooks
during generation itself, so no second target pass is needed). Each is written whole and then
renamed into place, the .jsonl last, so a crash loses at most the shard in progress and a rerun
continues after the last full shard. A .jsonl kept without its .pt (the tokens are a hundredth
of the features' size, small enough to keep where the features are not) gets its features again
from teacher-forced forwards of the same writer (features.replayed_features): in half the time
writing the replies took (a shard of 256 varied replies, 65,295 positions: 80 s against 161 s on
two cores), and within bf16 rounding of the captured features (1.3% relative, median).
Shard i > 0 also holds prompts built on passages the target wrote in shard i-1 (summarize,
answer from it, translate it), so those families read the target's own text. With
`passages="mixed"`, half of those passages are human prose instead (train.passages).
With `prompts="varied"`, a shard's prompts come from train.varied instead: templates, pasted
prose and code, requests the target writes itself and second turns of the previous shard's
conversations (the target writes those short texts first, in one batch).
Replies are written by batch_generate (a static KV cache, finished rows leaving the batch), the
same tokens `model.generate` writes on a greedy batch, several times faster on a CPU.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..chat import chat_prompt_ids
from . import varied
from .batch_generate import generate_batch
from .features import replayed_features
from .passages import passage_pool
from .prompts import Prompt, derived_prompts, direct_prompts

# Greedy replies are what greedy acceptance is measured on; sampled ones widen what the head sees.
MODES = ("greedy", "t0.7", "greedy", "t1.0")
PASSAGE_TOKENS = 160  # a passage longer than this is cut (at a sentence end when there is one)
PASSAGE_SOURCES = ("target", "mixed")  # passages the target wrote; half of them human prose instead
SETTINGS_FILE = "data_settings.json"  # what a folder's shards were written with
PROMPT_SOURCES = ("templates", "varied")  # prompts.py alone, or varied.py's mix
# What writes a batch's replies, recorded with a folder's recipe: "chunked-prefill" is
# batch_generate reading prompts in chunks of similar lengths; "static-batch" was batch_generate
# reading a batch's prompts as one (padded to the longest); folders from before either were
# written by `model.generate`. Each rounds differently, so the same seed writes other replies.
GENERATOR = "chunked-prefill"
RECIPE_DEFAULTS = {"prompts": "templates", "generator": "generate"}  # a record from before the key


@dataclass(frozen=True)
class DataSettings:
    shards: int
    per_shard: int = 32
    batch_size: int = 32
    max_new_tokens: int = 192
    seed: int = 0
    passages: str = "target"  # one of PASSAGE_SOURCES
    prompts: str = "templates"  # one of PROMPT_SOURCES


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
    report: Callable[[str], None] | None = None,
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
    _claim(out_dir, {**asdict(settings), "layer_ids": list(layer_ids), "writer": writer, "generator": GENERATOR})
    model, seen = None, None
    for done, index in enumerate(indices, start=1):
        path = shard_path(out_dir, index)
        if not path.exists():
            model = model if model is not None else model_factory()
            if out_dir != data_dir:  # written again by another model: the very same prompts
                prompts = _prompts_of(read_shard(shard_path(data_dir, index)))
            elif settings.prompts == "varied":
                seen = seen if seen is not None else _requests_seen(data_dir, index)
                prompts = _varied_prompts(model, tokenizer, index, data_dir, settings, seen)
            else:
                previous = read_shard(shard_path(data_dir, index - 1)) if index else []
                prompts = _shard_prompts(index, previous, tokenizer, settings)
            started = time.monotonic()
            rows, features = _generate_shard(model, tokenizer, prompts, index, settings, layer_ids)
            if report:
                seconds, tokens = time.monotonic() - started, sum(len(row["reply_ids"]) for row in rows)
                report(f"shard {index}: {len(rows)} replies, {tokens} reply tokens in {seconds:.0f} s ({tokens / seconds:.0f} tokens/s)")
            _write_features(out_dir, index, features)
            write_rows(path, rows)
        elif not features_path(out_dir, index).exists():  # tokens kept without their features
            model = model if model is not None else model_factory()
            started = time.monotonic()
            sequences = [row["prompt_ids"] + row["reply_ids"] for row in read_shard(path)]
            _write_features(out_dir, index, replayed_features(model, sequences, layer_ids))
            if report:
                positions, seconds = sum(len(s) - 1 for s in sequences), time.monotonic() - started
                report(f"shard {index}: features of {len(sequences)} kept replies again, {positions} positions in {seconds:.0f} s")
        if progress:
            progress(done, len(indices))
    return [shard_path(out_dir, index) for index in indices]


def _write_features(out_dir: Path, index: int, features: list[dict]) -> None:
    temporary = features_path(out_dir, index).with_suffix(".pt.tmp")
    torch.save(features, temporary)
    os.replace(temporary, features_path(out_dir, index))


def _claim(out_dir: Path, recipe: dict) -> None:
    """Record the recipe of a new folder's shards, or check an old folder's against it: a rerun
    with another --passages, --seed or reply length would otherwise add shards of another recipe
    beside the old ones, and train on both without a word. The shard count may grow."""
    recipe = {k: v for k, v in recipe.items() if k != "shards"}
    path = out_dir / SETTINGS_FILE
    if path.exists():
        refuse_other_settings({**RECIPE_DEFAULTS, **read_shard(path)[0]}, recipe, f"{out_dir} holds data shards written")
    elif not any(out_dir.glob("shard-*.jsonl")):  # a folder from before the record: left unchecked
        write_rows(path, [recipe])


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


def _prompts_of(rows: list[dict]) -> list[Prompt]:
    """The prompts a shard's rows were written for (conversations with their earlier turns)."""
    return [
        Prompt(row["family"], row.get("text", ""), row.get("topic", ""), tuple(map(tuple, row.get("history", ()))),
               row.get("from_shard"), prompt_ids=row["prompt_ids"])
        for row in rows
    ]


def _varied_prompts(model, tokenizer, index: int, data_dir: Path, settings: DataSettings, seen: set) -> list[Prompt]:
    """Shard `index`'s prompts from the varied source: the target first writes the shard's
    self-instruct requests and user turns (one short sampled batch), then they are filtered."""
    seed = settings.seed * 1_000_003 + index
    previous = read_shard(shard_path(data_dir, index - 1)) if index else []
    for row in previous:
        row["reply_text"] = tokenizer.decode(row["reply_ids"], skip_special_tokens=True)
    held = index in held_out_shards(settings.shards)
    plan, requests = varied.shard_plan(index, settings.per_shard, previous, seed, held)
    written = []
    if requests:
        eos = eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
        encoded = [chat_prompt_ids(tokenizer, [{"role": "user", "content": r["text"]}]) for r in requests]
        for start in range(0, len(encoded), settings.batch_size):
            replies, _ = generate_batch(model, encoded[start : start + settings.batch_size], max_new_tokens=varied.REQUEST_TOKENS,
                                        eos=eos, pad=pad, temperature=varied.REQUEST_TEMPERATURE, seed=seed + start)
            written += [tokenizer.decode(reply, skip_special_tokens=True) for reply in replies]
    passages = passage_prompts(index, previous, tokenizer, DataSettings(settings.shards, settings.per_shard, seed=settings.seed))
    return varied.assemble(plan, requests, written, seen, random.Random(seed), index, passages, settings.per_shard)


def _requests_seen(data_dir: Path, index: int) -> set:
    """The 4-word runs of the self-instruct requests of shards 0..index-1 (see varied.is_new)."""
    seen: set = set()
    for path in complete_shards(data_dir, index):
        for row in read_shard(path):
            if row["family"] == "self_instruct":
                varied.is_new(row["text"], seen)
    return seen


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
    encoded = [p.prompt_ids or chat_prompt_ids(tokenizer, p.messages()) for p in prompts]
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
            row = {"family": prompts[i].family, "topic": prompts[i].topic, "mode": mode,
                   "prompt_ids": encoded[i], "reply_ids": reply}
            if settings.prompts == "varied":  # what the next shard's conversations and requests read
                row["text"] = prompts[i].text
                if prompts[i].history:
                    row["history"] = prompts[i].history
                if prompts[i].from_shard is not None:
                    row["from_shard"] = prompts[i].from_shard
            rows.append(row)
            features.append(feature)
    return rows, features


def _generate_batch(
    model, tokenizer, prompts: list[list[int]], mode: str, seed: int, max_new_tokens: int, layer_ids: tuple[int, ...]
) -> tuple[list[list[int]], list[dict]]:
    """The target's replies to a batch of prompts, each cut after its first eos, and each
    sequence's features: {"aux": [n-1, 3H], "final": [n-1, H]} for its n = prompt + reply tokens
    (the last token is never fed to the target, and no label needs it)."""
    eos = eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    temperature = 0.0 if mode == "greedy" else float(mode[1:])
    return generate_batch(model, prompts, max_new_tokens=max_new_tokens, eos=eos, pad=pad, temperature=temperature,
                          seed=seed, layer_ids=layer_ids)


def eos_ids(model, tokenizer) -> list[int]:
    """The tokens that end a reply: the model's generation config's and the tokenizer's."""
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured] if configured is not None else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def write_rows(path: Path, rows: list[dict]) -> None:
    """Write JSON lines atomically: a file that exists is whole (shards are checkpoints)."""
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    os.replace(temporary, path)
