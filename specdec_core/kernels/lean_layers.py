"""The decoding steps of a Llama decoder layer on the 4-bit CPU path, as one plain function.

On CPU a decoding step of the offline model is mostly not arithmetic. Of SmolLM2-135M's 1-token
step (4-bit, 2 threads, 64 tokens of context: 17-19 ms), the int4 kernels take about 5.5 ms and
attention 0.7 ms; the rest is the framework around 211 kernel calls: the keyword plumbing and
decorators of transformers' layer, attention and linear modules, and a cast to bf16 and back
around every linear layer. Here a layer's step runs the same operators on the same values with
less around them, so every output, and every key and value cached, is bitwise what transformers'
layer gives (tested):
  - q, k and v are one kernel call over their weights stacked, and gate and up another
    (Int4Linear.stacked: the kernel computes each output column alone, checked at setup): four
    kernel calls a layer instead of seven, each input cast to bf16 once;
  - the norms, rotary embedding, cache update and activation are the layer's own modules and
    transformers' own function, and attention is row_exact_attention, called directly.
A SmolLM2 step takes about a fifth less so, a verify step as much, and compiled (CompiledSteps
traces this step) the calls saved still pay, bitwise the same logits (docs/benchmarks-costs.md;
scripts/cpu_weights_costs.py measures it). Only the steps it was
written for take this path: one sequence, at most row_attention.MAX_ROWS new tokens (decoding,
verifying drafts). Reading a prompt and a batch (the EAGLE trainer's generate) run transformers'
layer.
"""

from __future__ import annotations

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from ..decoding.tree import TREE_KWARG
from .int4_linear import Int4Linear
from .row_attention import MAX_ROWS, row_exact_attention, uses_row_exact_attention


def use_lean_layers(model) -> str | None:
    """Give each decoder layer of `model` (a Llama on int4 kernels with row-exact attention) the
    lean decoding step; why it can't, or None. Layers whose projections can't be stacked keep
    transformers' step."""
    if getattr(model.config, "model_type", None) != "llama":
        return f"lean decoder layers are written for Llama models, not {model.config.model_type}"
    if not uses_row_exact_attention(model):
        return "lean decoder layers need row-exact attention"
    leaned = 0
    for layer in model.model.layers:
        if isinstance(layer.forward, _LeanStep):
            leaned += 1
            continue
        attention, mlp = layer.self_attn, layer.mlp
        projections = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj,
                       mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if not all(isinstance(p, Int4Linear) and p.bias is None for p in projections):
            continue
        qkv = Int4Linear.stacked([attention.q_proj, attention.k_proj, attention.v_proj])
        gate_up = Int4Linear.stacked([mlp.gate_proj, mlp.up_proj])
        if qkv is None or gate_up is None:
            continue
        layer.forward = _LeanStep(layer, qkv, gate_up)
        leaned += 1
    return None if leaned else "no decoder layer has 4-bit projections that stack on the int4 kernel"


def uses_lean_layers(model) -> bool:
    layers = getattr(getattr(model, "model", None), "layers", ())
    return any(isinstance(layer.forward, _LeanStep) for layer in layers)


class _LeanStep:
    """A LlamaDecoderLayer's forward: the lean step where it applies (see the module docstring),
    the layer's own forward elsewhere. An object rather than a closure, so that a deep copy of the
    model gets steps of its own layers."""

    def __init__(self, layer, qkv: Int4Linear, gate_up: Int4Linear) -> None:
        attention, mlp = layer.self_attn, layer.mlp
        self.layer, self.stock, self.qkv, self.gate_up = layer, layer.forward, qkv, gate_up
        self.qkv_sizes = [p.out_features for p in (attention.q_proj, attention.k_proj, attention.v_proj)]
        self.gate_up_sizes = [mlp.gate_proj.out_features, mlp.up_proj.out_features]

    def __call__(self, hidden_states: torch.Tensor, attention_mask=None, position_embeddings=None, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        batch, rows, _ = hidden_states.shape
        if batch != 1 or rows > MAX_ROWS or cache is None or position_embeddings is None:
            return self.stock(hidden_states, attention_mask=attention_mask, position_embeddings=position_embeddings,
                              **kwargs)
        layer = self.layer
        attention, mlp = layer.self_attn, layer.mlp
        q, k, v = (part.view(1, rows, -1, attention.head_dim).transpose(1, 2)
                   for part in _product(self.qkv, layer.input_layernorm(hidden_states)).split(self.qkv_sizes, dim=-1))
        q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        k, v = cache.update(k, v, attention.layer_idx)
        attended, _ = row_exact_attention(attention, q, k, v, None, dropout=0.0, scaling=attention.scaling,
                                          **{TREE_KWARG: kwargs.get(TREE_KWARG)})  # a tree's step: its parents
        hidden_states = hidden_states + _product(attention.o_proj, attended.reshape(rows, -1))
        normed = layer.post_attention_layernorm(hidden_states)
        gate, up = _product(self.gate_up, normed).split(self.gate_up_sizes, dim=-1)
        return hidden_states + _product(mlp.down_proj, mlp.act_fn(gate) * up)


def _product(linear: Int4Linear, x: torch.Tensor) -> torch.Tensor:
    """x [..., rows, in] -> [rows, out] in x's dtype, as Int4Linear.forward computes it (on the
    kernel: a step is far below DENSE_ROWS rows), the input repeated for a layer that reads it twice."""
    rows = x.reshape(-1, linear.in_features)
    return linear.kernel(rows.repeat(1, linear.reads_input) if linear.reads_input > 1 else rows).to(x.dtype)
