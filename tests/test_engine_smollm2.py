"""The real SmolLM2-135M-Instruct: speculative greedy output equals plain greedy output."""

import pytest
import torch

from specdec_core import PromptLookupDrafter, SamplingParams, SpeculativeEngine

CHATS = [
    "Summarize in one sentence: The Eiffel Tower, built in 1889 for the World's Fair in Paris, "
    "was criticised by artists at first but became the most visited paid monument in the world.",
    "Write a Python function that returns the squares of a list of numbers.",
]


@pytest.mark.parametrize("message", CHATS)
def test_prompt_lookup_equals_baseline_and_hf(smollm2, message):
    model, tokenizer = smollm2
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    params = SamplingParams(max_new_tokens=48)
    baseline = SpeculativeEngine(model, tokenizer).generate(prompt, params)
    # Fixed k: every round with a match drafts (the adaptive policy may rightly decline to).
    lookup = SpeculativeEngine(model, tokenizer, drafter=PromptLookupDrafter(), adaptive=False).generate(
        prompt, params)
    assert lookup.token_ids == baseline.token_ids
    assert lookup.text == baseline.text == tokenizer.decode(baseline.token_ids, skip_special_tokens=True)
    assert lookup.stats.drafted_tokens > 0 and "resampled" in lookup.sources  # it did speculate
    adaptive = SpeculativeEngine(model, tokenizer, drafter=PromptLookupDrafter()).generate(prompt, params)
    assert adaptive.token_ids == baseline.token_ids

    hf = model.generate(torch.tensor([prompt]), max_new_tokens=48, do_sample=False)[0, len(prompt):]
    assert baseline.token_ids == hf.tolist()


def test_eagle_and_hybrid_on_the_real_model_equal_the_baseline(smollm2):
    """A random EAGLE-3 head of SmolLM2-135M's shape (its first 8192 token ids) on the real
    target: the features of layers 2, 15 and 27 flow, it drafts, and greedy output is unchanged."""
    from specdec_core import EagleDrafter, HybridDrafter
    from specdec_core.drafters import Eagle3Head

    model, tokenizer = smollm2
    head = Eagle3Head.random(model.config, draft_vocab_size=8192)
    assert head.layer_ids == (2, 15, 27) and 9e6 < head.parameter_count < 11e6
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": CHATS[1]}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    params = SamplingParams(max_new_tokens=32)
    baseline = SpeculativeEngine(model, tokenizer).generate(prompt, params).token_ids
    for drafter in (EagleDrafter(head), HybridDrafter(EagleDrafter(head))):
        result = SpeculativeEngine(model, tokenizer, drafter=drafter, draft_length=3, adaptive=False).generate(
            prompt, params)
        assert result.token_ids == baseline, drafter.name
        assert result.stats.drafted_tokens > 0


def test_medusa_heads_on_the_real_model_and_the_4bit_target_equal_the_baseline(smollm2, smollm2_local):
    """Random Medusa heads of SmolLM2-135M's width, read out through its lm_head (the int4 one on
    the 4-bit target the offline preset runs): the last layer's output flows, they draft, and
    greedy output is unchanged on both targets."""
    from specdec_core import MedusaDrafter
    from specdec_core.drafters import MedusaHeads

    heads = MedusaHeads.random(3, 1, 576, None, seed=0, std=0.01)
    for model, tokenizer, make_runner in ((*smollm2, None), (smollm2_local.target, smollm2_local.tokenizer,
                                                              smollm2_local.path("target"))):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": CHATS[1]}], add_generation_prompt=True, return_dict=True
        )["input_ids"]
        params = SamplingParams(max_new_tokens=32)
        runner = {"make_runner": make_runner} if make_runner is not None else {}
        baseline = SpeculativeEngine(model, tokenizer, **runner).generate(prompt, params).token_ids
        drafter = MedusaDrafter(heads, num_target_layers=model.config.num_hidden_layers)
        result = SpeculativeEngine(model, tokenizer, drafter=drafter, draft_length=3, adaptive=False, **runner).generate(
            prompt, params)
        assert result.token_ids == baseline
        assert result.stats.drafted_tokens > 0


def test_layer_skip_on_the_real_model_equals_the_baseline_and_calibrates(smollm2):
    """SmolLM2's own layers with a subset skipped draft for it: with a fixed subset (every other
    middle layer) it drafts and its drafts are kept, and greedy output is unchanged; calibrated,
    it scores every candidate subset and picks the one with the highest predicted speedup, or
    drafts nothing where none pays, and the reply is again the baseline's."""
    from specdec_core import LayerSkipDrafter
    from specdec_core.drafters import layer_skip

    model, tokenizer = smollm2
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": CHATS[1]}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    params = SamplingParams(max_new_tokens=32)
    baseline = SpeculativeEngine(model, tokenizer).generate(prompt, params).token_ids
    patterns = {pattern.name: pattern for pattern in layer_skip.candidate_patterns(30)}
    assert len(patterns) == 5
    fixed = LayerSkipDrafter(kept_layers=patterns["every other middle layer skipped"].kept)
    result = SpeculativeEngine(model, tokenizer, drafter=fixed, draft_length=3, adaptive=False).generate(prompt, params)
    assert result.token_ids == baseline
    assert 0 < result.stats.accepted_tokens < result.stats.drafted_tokens

    calibrated = LayerSkipDrafter()
    engine = SpeculativeEngine(model, tokenizer, drafter=calibrated)
    calibration = calibrated.calibration
    assert [score.pattern.name for score in calibration.scores] == list(patterns)
    costs = {score.pattern.name: score.cost for score in calibration.scores}
    assert all(0 < score.acceptance < 1 for score in calibration.scores)
    # CPU time: half the layers cost less than five in six of them, whatever else runs
    assert costs["early exit at 1/2"] < costs["every third middle layer skipped"]
    best = max(calibration.scores, key=lambda score: score.speedup)
    assert calibration.chosen is (best if best.speedup >= layer_skip.MIN_SPEEDUP else None)
    assert calibrated.kept == (best.pattern.kept if calibration.chosen else None)
    assert best.pattern.name in calibration.line()
    assert engine.generate(prompt, params).token_ids == baseline
