"""Lean decoder layers (specdec_core/kernels/lean_layers.py): the 4-bit CPU path's decoding steps without
transformers' plumbing, bitwise what transformers' layers compute."""

from __future__ import annotations

import copy

import torch
from torch.profiler import profile

from specdec_core.kernels.int4_linear import Int4Linear, quantise_linear_layers
from specdec_core.kernels.lean_layers import use_lean_layers, uses_lean_layers
from specdec_core.kernels.row_attention import MAX_ROWS, use_row_exact_attention
from specdec_core.decoding.eager import CachedModel
from tests.test_row_attention import VOCAB, _int4_tiny_llama
from tests.tiny_models import tiny_llama, tiny_qwen2

# Widths the int4 packing's blocks of 64 output rows divide, so q, k and v (and gate and up) stack.
STACKABLE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1)


def _stock_and_lean(seed: int = 7):
    """A tiny 4-bit Llama with row-exact attention, as transformers runs it and with lean layers."""
    stock = tiny_llama(seed, vocab=VOCAB, init=0.2, **STACKABLE)
    assert quantise_linear_layers(stock) == 2 * 7 + 1
    assert use_row_exact_attention(stock) is None
    lean = copy.deepcopy(stock)
    assert use_lean_layers(lean) is None and uses_lean_layers(lean) and not uses_lean_layers(stock)
    return stock, lean


def _tokens(seed: int, count: int) -> list[int]:
    return torch.randint(0, VOCAB, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def _kernel_calls(runner: CachedModel, tokens: list[int]) -> int:
    with profile() as profiled:
        runner.forward(tokens)
    return sum(event.count for event in profiled.key_averages() if event.key == "aten::_weight_int4pack_mm_for_cpu")


def test_every_step_and_every_cached_key_is_bitwise_transformers_own():
    stock, lean = _stock_and_lean()
    runners = CachedModel(stock), CachedModel(lean)
    tokens = _tokens(0, 80)
    start = 0
    for size in (30, 1, 2, 5, MAX_ROWS, 3, 1):  # a prompt (transformers' layer), then steps (the lean one)
        logits = [runner.forward(tokens[start : start + size]) for runner in runners]
        assert torch.equal(*logits), size
        start += size
    for stock_layer, lean_layer in zip(*(runner.cache.layers for runner in runners)):
        assert torch.equal(stock_layer.keys, lean_layer.keys) and torch.equal(stock_layer.values, lean_layer.values)
    runners[1].crop(40)  # a rollback, and steps again
    runners[0].crop(40)
    assert torch.equal(*[runner.forward(tokens[40:44]) for runner in runners])


def test_a_step_makes_four_kernel_calls_a_layer_instead_of_seven():
    stock, lean = _stock_and_lean()
    prompt = _tokens(1, 20)
    calls = []
    for model in (stock, lean):
        runner = CachedModel(model)
        runner.forward(prompt)
        calls.append(_kernel_calls(runner, prompt[:3]))
    assert calls == [2 * 7 + 1, 2 * 4 + 1]  # two layers and the head


def test_stacked_projections_hold_no_second_copy_of_the_weights():
    stock, lean = _stock_and_lean()
    assert lean.get_memory_footprint() == stock.get_memory_footprint()
    attention = lean.model.layers[0].self_attn
    storages = {p.packed.untyped_storage().data_ptr() for p in (attention.q_proj, attention.k_proj, attention.v_proj)}
    assert len(storages) == 1


def test_batches_and_generate_run_as_transformers_runs_them():
    """A padded batch takes transformers' layer; generate()'s steps, one sequence, the lean one."""
    stock, lean = _stock_and_lean()
    ids = torch.tensor([_tokens(2, 12), [2] * 4 + _tokens(3, 8)])
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    outputs = [model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=2)
               for model in (stock, lean)]
    assert torch.equal(*outputs)
    single = [model.generate(ids[:1], max_new_tokens=20, do_sample=False, pad_token_id=2) for model in (stock, lean)]
    assert torch.equal(*single)


def test_projections_that_dont_stack_keep_transformers_step():
    """At 64 wide, k and v have 32 output rows: half a block of the packing, so stacking them
    would mix rows of two layers. The check finds it, and nothing changes."""
    model = _int4_tiny_llama(seed=4)
    assert use_row_exact_attention(model) is None
    attention = model.model.layers[0].self_attn
    before = attention.k_proj.packed
    assert Int4Linear.stacked([attention.q_proj, attention.k_proj, attention.v_proj]) is None
    assert attention.k_proj.packed is before
    assert use_lean_layers(model) == "no decoder layer has 4-bit projections that stack on the int4 kernel"
    assert not uses_lean_layers(model)


def test_other_models_keep_transformers_layers_and_say_why():
    qwen = tiny_qwen2(seed=1, vocab=VOCAB, init=0.2)
    assert use_lean_layers(qwen) == "lean decoder layers are written for Llama models, not qwen2"
    no_row_exact = tiny_llama(seed=1, vocab=VOCAB, init=0.2, **STACKABLE)
    quantise_linear_layers(no_row_exact)
    assert use_lean_layers(no_row_exact) == "lean decoder layers need row-exact attention"
    fp32 = tiny_llama(seed=1, vocab=VOCAB, init=0.2, **STACKABLE)
    assert use_row_exact_attention(fp32) is None
    assert use_lean_layers(fp32) == "no decoder layer has 4-bit projections that stack on the int4 kernel"


def test_compiled_lean_steps_compute_what_compiled_transformers_layers_do():
    """CompiledSteps traces the lean step too (one int4 call fewer per stacked projection pays
    there as well); its rows, padded and in pieces, are bitwise what the same model's compiled
    steps give on transformers' layers (whose rows test_compiled_runner checks against 1-token steps)."""
    from specdec_core.decoding.compiled import COMPILED_DYNAMIC, CompiledSteps

    prompt, tokens = _tokens(0, 30), _tokens(1, 12)
    rows = []
    for model in _stock_and_lean():
        steps = CompiledSteps(model, step_sizes=(1, 4), progress=False)
        assert steps.decode_path == COMPILED_DYNAMIC, steps.fallback_reason
        runner = steps()
        runner.forward(prompt, last_only=True)
        rows.append(torch.cat([runner.forward(tokens[i : i + size]) for i, size in ((0, 3), (3, 1), (4, 5), (9, 3))]))
    assert torch.equal(*rows)


def test_a_deep_copy_steps_its_own_layers_and_a_second_call_changes_nothing():
    stock, lean = _stock_and_lean()
    assert use_lean_layers(lean) is None  # again: nothing stacked twice
    twin, stock_twin = copy.deepcopy(lean), copy.deepcopy(stock)
    with torch.no_grad():  # the copies' weights change; the original's steps must not see it
        for model in (twin, stock_twin):
            for layer in model.model.layers:
                layer.post_attention_layernorm.weight.mul_(2)
    tokens = _tokens(5, 24)
    runners = [CachedModel(model) for model in (stock, lean, stock_twin, twin)]
    outputs = [torch.cat([runner.forward(tokens[:20]), runner.forward(tokens[20:])]) for runner in runners]
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[2], outputs[3])
    assert not torch.equal(outputs[1], outputs[3])
    assert uses_lean_layers(twin) and lean.get_memory_footprint() == stock.get_memory_footprint()
