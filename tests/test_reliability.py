"""The reliability promises of the engine, the presets and the CLI: why a reply ended, seeds that
reproduce, bounded cache memory, config ranges, user text that stays text, GGUF errors."""

from __future__ import annotations

import pytest

from specdec_core import PromptLookupDrafter, SamplingParams, SpeculativeEngine
from specdec_core.events import FINISH_REASONS
from tests.tiny_models import tiny_llama


@pytest.fixture(scope="module")
def short_context_target():
    """A tiny model that reads at most 64 tokens, so the context limit is easy to reach."""
    model = tiny_llama(seed=0)
    model.config.max_position_embeddings = 64  # what the engine reads as the context limit
    return model


# ---------------------------------------------------------------- why a reply ended


def test_finish_reason_tells_length_from_the_context_limit_and_stop(short_context_target, smol_tokenizer):
    engine = SpeculativeEngine(short_context_target, smol_tokenizer, drafter=PromptLookupDrafter())
    prompt = list(range(100, 158))  # 58 tokens: room for 6 more in a 64-token context
    cut = engine.generate(prompt, SamplingParams(max_new_tokens=32))
    assert cut.stats.finish_reason == "length (context)" and len(cut.token_ids) == 6
    assert cut.stats.as_dict()["finish_reason"] == "length (context)"
    short = engine.generate(prompt, SamplingParams(max_new_tokens=3))
    assert short.stats.finish_reason == "length" and len(short.token_ids) == 3
    eos = short.token_ids[1]  # make the reply's second token end it
    stopping = SpeculativeEngine(short_context_target, smol_tokenizer)
    stopping.eos_ids = {eos}
    stopped = stopping.generate(prompt, SamplingParams(max_new_tokens=32))
    assert stopped.stats.finish_reason == "stop" and stopped.token_ids[-1] == eos
    assert {cut.stats.finish_reason, short.stats.finish_reason, stopped.stats.finish_reason} == set(FINISH_REASONS)
