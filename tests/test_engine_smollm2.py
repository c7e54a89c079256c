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
