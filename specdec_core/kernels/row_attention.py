"""Attention that gives each row of a verify step bitwise what a 1-token step gives it.

Greedy speculation is lossless only if the target scores a token the same way in a verify
step over 1 + k tokens as in a 1-token step. In fp32 the two differ by float rounding (about
1e-6), which decides an argmax about never. On a low-precision target they can differ by far
more: the 4-bit CPU path (int4_linear) rounds every layer's input and output to bf16, so its
logits have 8 significant bits, the top two tokens often tie exactly, and a rounding difference
anywhere upstream breaks such a tie one way in a 1-token step and the other in a verify step
(measured on SmolLM2-135M: 82 of 99 verify rows differed from their 1-token steps, by up to
0.44 in a logit).

Every other part of such a model already computes each row alone: the int4 kernel (checked at
load, see int4_linear.kernel_problem), the norms, rotary embeddings and activations. Attention
does not: a verify step runs one kernel over all its query rows, against more keys, with a
causal mask, while a 1-token step runs another (transformers packs grouped-query heads for it).
Here each query row of a short step runs exactly the call a 1-token step makes at its
position: one query, the keys up to and including its own, no mask. So every row, and every key
and value it writes into the cache, is bitwise what plain decoding writes, and greedy output is
token-for-token identical (tested on the real 4-bit model). Reading a prompt (more than
MAX_ROWS tokens) takes the stock path: plain and speculative decoding read a prompt alike.

A batch of sequences (the EAGLE trainer's left-padded `generate`) also takes the stock path,
with its mask: the row path attends to every key before a row, and in a padded batch some of
those are padding. (It once did not, and the trainer's replies to every prompt shorter than
the longest of its batch came out as word salad: "a immersive immersive immersive ...".)

It costs a few ms per verify step on CPU (SmolLM2-135M, 2 threads: a step over 1 + 8 tokens 44
instead of 41 ms at 64 tokens of context); 1-token steps are unchanged. Batch size 1 and
full causal attention only: a model with sliding-window layers keeps the stock attention.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..decoding.base import MAX_STEP_TOKENS
from ..decoding.eager import allow_trees
from ..decoding.tree import TREE_KWARG, attended_rows

NAME = "row_exact_sdpa"
MAX_ROWS = MAX_STEP_TOKENS  # the longest verify step: a token and its drafts


def row_exact_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' attention signature: query [batch, heads, rows, d], key and value
    [batch, kv_heads, cached + rows, d] -> ([batch, rows, heads, d], None). Row by row only for
    batch 1 (the engine's steps). A tree's step (its parents under TREE_KWARG, see
    decoding/tree.py): each row attends to the cached keys and its ancestors' and its own, gathered
    in path order, so it computes what a 1-token step at the end of its path would."""
    batch, _, rows, _ = query.shape
    if rows > MAX_ROWS or batch > 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    seen = key.shape[2] - rows + 1  # keys the first row attends to: the cached ones and itself
    tree = kwargs.get(TREE_KWARG)
    if isinstance(tree, tuple):  # a compiled tree step's paths, one tensor per row after the first
        row_keys, row_values = _path_keys_and_values(key, value, seen - 1, tree)
    else:
        gathered = _tree_key_indices(seen - 1, tree, key.device) if tree is not None else [None] * rows
        row_keys, row_values = [], []
        for i, index in enumerate(gathered):
            if index is None:  # the cached keys and the rows before this one: a chain's row
                row_keys.append(key[:, :, : seen + i])
                row_values.append(value[:, :, : seen + i])
            else:
                row_keys.append(key.index_select(2, index))
                row_values.append(value.index_select(2, index))
    # torch's sdpa called directly, as transformers calls it for an unmasked grouped-query row
    # (sdpa_attention_forward's checks around it cost about 17 us a call, 30 calls a row here)
    outputs = []
    for i, (row_key, row_value) in enumerate(zip(row_keys, row_values)):
        outputs.append(torch.nn.functional.scaled_dot_product_attention(
            query[:, :, i : i + 1], row_key, row_value,
            dropout_p=kwargs.get("dropout", 0.0), scale=kwargs.get("scaling"), enable_gqa=query.shape[1] != key.shape[1]))
    return (outputs[0] if rows == 1 else torch.cat(outputs, dim=2)).transpose(1, 2).contiguous(), None


def _path_keys_and_values(key, value, cached: int, paths: tuple[torch.Tensor, ...]):
    """Each row's keys and values in a compiled tree step: the cached ones, then those of its
    path's rows (`paths[i - 1]`: row i's ancestors and itself in path order, tree.path_tensors);
    row 0, the context's last token, reads as a chain's first row. The paths are inputs of the
    compiled graph whose sizes are symbols, so one graph serves every tree shape of its node
    count (compiled.py). Concatenated, not gathered with the cached positions' indices as the
    eager step does: the same values, one copy instead of an index read per key."""
    row_keys, row_values = [key[:, :, : cached + 1]], [value[:, :, : cached + 1]]
    new_keys, new_values = key[:, :, cached:], value[:, :, cached:]
    for path in paths:
        row_keys.append(torch.cat([key[:, :, :cached], new_keys.index_select(2, path)], dim=2))
        row_values.append(torch.cat([value[:, :, :cached], new_values.index_select(2, path)], dim=2))
    return row_keys, row_values


def _tree_key_indices(cached: int, parents: list[int], device) -> list[torch.Tensor | None]:
    """Per row of a tree's step, the keys it attends to (the cached ones, then its path's rows),
    or None where those are simply all the rows up to its own (a slice does)."""
    indices = []
    for row, attended in enumerate(attended_rows(parents)):
        if attended == list(range(row + 1)):
            indices.append(None)
        else:
            path = torch.tensor(attended, device=device) + cached
            indices.append(torch.cat([torch.arange(cached, device=device), path]))
    return indices


def why_not_row_exact(model) -> str | None:
    """Why row-exact attention can't serve `model`, or None."""
    config = model.config
    layer_types = getattr(config, "layer_types", None) or ()
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "it has sliding-window attention"
    if any(kind != "full_attention" for kind in layer_types):
        return "not all its layers use full attention"
    return None


def use_row_exact_attention(model) -> str | None:
    """Switch `model` (batch size 1 decoding) to row-exact attention; why not, or None."""
    problem = why_not_row_exact(model)
    if problem:
        return problem
    AttentionInterface.register(NAME, row_exact_attention)
    allow_trees(NAME, MAX_ROWS - 1, compiled=True)  # a tree's rows too: each attends to the prefix and its ancestors
    AttentionMaskInterface.register(NAME, sdpa_mask)  # for prompts: the stock sdpa masks
    model.set_attn_implementation(NAME)
    return None


def uses_row_exact_attention(model) -> bool:
    return getattr(model.config, "_attn_implementation", None) == NAME
