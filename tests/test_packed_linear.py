"""Linear layers prepacked for oneDNN on CPU: the same numbers to float rounding, the same
greedy text on the real SmolLM2, and only the layers it can serve are swapped."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from specdec_core import PromptLookupDrafter, SamplingParams, SpeculativeEngine
from specdec_core.kernels.packed_linear import PackedLinear, has_packed_layers, pack_linear_layers, packing_problem
from tests.tiny_models import tiny_llama, tiny_qwen2

PROMPT = torch.tensor([[5, 17, 99, 1234, 4321, 7, 7, 42, 3000, 11]])


def test_this_torch_build_can_pack():
    # The CPU wheels CI installs have oneDNN; without it the app would run on stock kernels.
    assert packing_problem() is None


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2 (biased q/k/v)"])
def test_packed_model_gives_the_stock_logits_to_float_rounding(make):
    model = make(seed=3, init=0.2)
    with torch.inference_mode():
        stock = model(PROMPT).logits
    swapped, problem = pack_linear_layers(model)
    assert problem is None
    assert swapped == 7 * 2 + 1  # q, k, v, o, gate, up, down per layer, and the head
    with torch.inference_mode():
        packed = model(PROMPT).logits
    torch.testing.assert_close(packed, stock, rtol=1e-4, atol=1e-5)


def test_only_fp32_cpu_linears_are_swapped_and_the_head_keeps_its_weight():
    model = tiny_llama(seed=1, tie_word_embeddings=True)
    pack_linear_layers(model)
    head = model.get_output_embeddings()
    assert isinstance(head, PackedLinear) and head.weight is model.get_input_embeddings().weight
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert not any(name.endswith("proj.weight") for name, _ in model.named_parameters())  # freed

    bf16 = tiny_llama(seed=1).to(torch.bfloat16)
    assert pack_linear_layers(bf16) == (0, None) and not has_packed_layers(bf16)


def test_packing_keeps_the_real_models_greedy_text(smollm2):
    """SmolLM2-135M packed: plain and speculative greedy decoding give what stock HF generate()
    gives on the unpacked model."""
    model, tokenizer = smollm2
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Repeat this list twice: apples, pears, plums, cherries."}],
        add_generation_prompt=True, return_dict=True,
    )["input_ids"]
    stock = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, len(prompt):].tolist()
    packed = copy.deepcopy(model)
    pack_linear_layers(packed)
    assert has_packed_layers(packed)
    params = SamplingParams(max_new_tokens=40)
    assert SpeculativeEngine(packed, tokenizer).generate(prompt, params).token_ids == stock
    lookup = SpeculativeEngine(packed, tokenizer, drafter=PromptLookupDrafter(), adaptive=False).generate(prompt, params)
    assert lookup.token_ids == stock and lookup.stats.accepted_tokens > 0


def test_where_packing_cant_be_done_the_models_load_stock_and_a_note_says_why(tiny_presets, monkeypatch):
    from specdec_core.kernels import packed_linear
    from specdec_core.presets import loading

    monkeypatch.setattr(packed_linear, "packing_problem", lambda: "measured faster on x86-64 only, this is arm64")
    models = loading.load_preset("tiny", tiny_presets.config)
    assert not has_packed_layers(models.target) and not has_packed_layers(models.draft)
    assert "target: stock linear layers (measured faster on x86-64 only, this is arm64)" in models.notes
    assert "prepacked" not in models.describe()
