"""Batched generation for the trainer's data: many prompts at once on a static KV cache, with the
target's features captured on the way.

Why not `model.generate`: on a 2-core CPU, the data is written at the speed of the batch's
matmuls, so the batch should be large (64-256 rows), and then what `generate` does around them
costs: a DynamicCache concatenates every layer's keys and values at every step (a copy that
grows with the batch and the length), and rows that finished keep being computed until the
longest reply ends. Here:

- the KV cache is static (allocated once, sized to the longest prompt + the reply cap, written
  in place), and each step's attention reads only the slots written so far: transformers'
  StaticCache hands attention every slot, the empty ones masked, and on a CPU attention is the
  larger part of a step over long prompts (55% against the matmuls' 33%, 128 rows with prompts
  up to 453 tokens); reading only the written slots made such a batch's 96 tokens 21% quicker;
  the attention mask is built once (left padding hidden);
- the prompts are read in chunks of similar lengths, each left-padded only to its own longest
  prompt and its keys and values placed right-aligned in the batch's cache: read as one batch
  padded to the longest, that half of a shard cost 94 s (128 prompts of 50 to 453 tokens,
  58,000 positions for 13,000 real ones, with attention over all of them);
- a row that wrote its eos leaves the batch: when a quarter of the rows are done, the cache,
  the positions and the tokens are cut down to the rows still writing (so a batch costs about
  what its replies' tokens cost, not its longest reply times its rows);
- each step is one forward of the rows still writing, greedy or sampled from the full
  distribution at a temperature, no per-row Python but the final assembly.

The result is the one `generate` gives, token for token on a greedy batch (a test checks it
against one prompt at a time), and the features are those a fresh forward of each finished
sequence computes (a test checks that too).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, StaticLayer

from .features import capture_features

# Cut the batch down to its writing rows once this share of them is done: often enough that
# finished rows cost little, rarely enough that copying the cache does not (a copy costs about
# one step of the rows it keeps).
COMPACT_SHARE = 0.25
PREFILL_ROWS = 16  # prompts read together (sorted by length, so padded little)


@torch.no_grad()
def generate_batch(
    model, prompts: list[list[int]], *, max_new_tokens: int, eos: list[int], pad: int,
    temperature: float = 0.0, seed: int = 0, layer_ids: tuple[int, ...] = (),
) -> tuple[list[list[int]], list[dict]]:
    """(replies, features) for a batch of prompt token lists. A reply ends after its first eos
    token (kept) or at `max_new_tokens`. temperature 0 is greedy; above, sampling from the full
    distribution (no top-k or top-p), seeded by `seed`. features[b] = {"aux": [n-1, 3H],
    "final": [n-1, H]} fp16 for the n = prompt + reply tokens of row b (see features.py)."""
    rows, width = len(prompts), max(len(p) for p in prompts)
    length = width + max_new_tokens
    mask = torch.ones(rows, length, dtype=torch.long)
    for b, p in enumerate(prompts):
        mask[b, : width - len(p)] = 0  # left padding; later slots: the causal mask hides them
    positions = (mask[:, :width].cumsum(-1) - 1).clamp(min=0)
    generator = torch.Generator().manual_seed(seed)
    eos_ids = torch.tensor(eos)
    cache = Cache(layers=[_FilledSlots(max_cache_len=length) for _ in range(model.config.get_text_config().num_hidden_layers)])
    hidden = model.config.get_text_config().hidden_size
    kept = length - 1 if layer_ids else 0  # no features asked for: none kept
    aux = torch.zeros(rows, kept, len(layer_ids) * hidden, dtype=torch.float16)
    final = torch.zeros(rows, kept, hidden, dtype=torch.float16)
    replies = torch.full((rows, max_new_tokens), pad, dtype=torch.long)
    ends = torch.full((rows,), max_new_tokens, dtype=torch.long)  # reply lengths, eos included
    live = torch.arange(rows)  # original row of each row still in the batch
    done = torch.zeros(rows, dtype=torch.bool)  # of the rows still in the batch

    with capture_features(model, layer_ids) if layer_ids else nullcontext([]) as calls:

        def keep_features(batch_rows: torch.Tensor, first_slot: int) -> None:
            if layer_ids:
                step_aux, step_final = calls.pop()
                aux[batch_rows, first_slot : first_slot + step_aux.shape[1]] = step_aux
                final[batch_rows, first_slot : first_slot + step_final.shape[1]] = step_final

        logits = _read_prompts(model, prompts, pad, mask, positions, cache, keep_features)
        for step in range(max_new_tokens):
            if step:
                logits = model(
                    input_ids=token[:, None], attention_mask=mask[:, : width + step], position_ids=positions,
                    cache=cache, use_cache=True, logits_to_keep=1,
                ).logits[:, -1]
                keep_features(live, width + step - 1)
            token = _next_token(logits, temperature, generator)
            replies[live, step] = token
            newly = ~done & torch.isin(token, eos_ids)
            ends[live[newly]] = step + 1
            done |= newly
            if bool(done.all()):
                break
            # Never down to one row: a lone row takes row-exact attention's unmasked path
            # (kernels/row_attention.py, the 4-bit target's), which would read its left padding.
            if done.float().mean() >= COMPACT_SHARE and int((~done).sum()) > 1:
                keep = (~done).nonzero().squeeze(1)
                _keep_rows(cache, keep)
                live, done, token, mask = live[keep], done[keep], token[keep], mask[keep]
                positions = positions[keep]
            positions = positions[:, -1:] + 1

    texts, features = [], []
    for b, prompt in enumerate(prompts):
        cut = int(ends[b])
        texts.append(replies[b, :cut].tolist())
        first, last = width - len(prompt), width + cut - 1  # positions 0 .. n-2 of the sequence
        features.append({"aux": aux[b, first:last].clone(), "final": final[b, first:last].clone()})
    return texts, features


class _FilledSlots(StaticLayer):
    """A static cache layer whose attention reads only the slots written so far (StaticLayer's
    reads all of them, the empty ones masked: see the module docstring)."""

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        filled = int(self.cumulative_length)
        return keys[:, :, :filled], values[:, :, :filled]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return int(self.cumulative_length) + query_length, 0


def _read_prompts(model, prompts: list[list[int]], pad: int, mask: torch.Tensor, positions: torch.Tensor,
                  cache: Cache, keep_features) -> torch.Tensor:
    """Read the prompts into `cache` (each right-aligned at the batch's width, as left padding
    puts it) in chunks of PREFILL_ROWS similar lengths, each padded only to its own longest;
    return each row's last logits [rows, vocab]."""
    rows, width = len(prompts), positions.shape[1]
    order = sorted(range(rows), key=lambda b: len(prompts[b]))
    logits = None
    for start in range(0, rows, PREFILL_ROWS):
        chunk = torch.tensor(order[start : start + PREFILL_ROWS])
        own = max(len(prompts[b]) for b in chunk.tolist())  # the chunk's width
        ids = torch.tensor([[pad] * (own - len(prompts[b])) + prompts[b] for b in chunk.tolist()])
        chunk_cache = DynamicCache()
        output = model(input_ids=ids, attention_mask=mask[chunk, width - own : width],
                       position_ids=positions[chunk, width - own :], cache=chunk_cache, use_cache=True, logits_to_keep=1)
        keep_features(chunk, width - own)
        for layer, read in zip(cache.layers, chunk_cache.layers, strict=True):
            if not layer.is_initialized:
                layer.lazy_initialization(read.keys.new_empty(rows, *read.keys.shape[1:]),
                                          read.values.new_empty(rows, *read.values.shape[1:]))
            layer.keys[chunk, :, width - own : width] = read.keys
            layer.values[chunk, :, width - own : width] = read.values
        if logits is None:
            logits = output.logits.new_empty(rows, output.logits.shape[-1])
        logits[chunk] = output.logits[:, -1]
    for layer in cache.layers:
        layer.cumulative_length.fill_(width)
    return logits


def _next_token(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    if temperature <= 0:
        return logits.argmax(-1)
    probabilities = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probabilities, 1, generator=generator).squeeze(1)


def _keep_rows(cache: Cache, keep: torch.Tensor) -> None:
    """Cut every layer's keys and values down to rows `keep` (in that order). Every row sits at
    the same cache position, so the layers' shared write position stays as it is."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False):
            layer.keys = layer.keys.index_select(0, keep)
            layer.values = layer.values.index_select(0, keep)
