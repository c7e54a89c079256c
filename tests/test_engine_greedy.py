"""Greedy speculative output is token-for-token the baseline's and Hugging Face generate()'s."""

import itertools

import pytest
import torch

from specdec_core import (
    EagleDrafter,
    HybridDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    SamplingParams,
    SpeculativeEngine,
)
from tests.tiny_models import fitted_eagle_head, perturbed_copy, random_eagle_head, tiny_llama, tiny_qwen2

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "def add(a, b):\n    return a + b\n\ndef",
    "Translate to French: the cat sat on the mat.",
]
NEW_TOKENS = 24


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def family(request):
    build = tiny_llama if request.param == "llama" else tiny_qwen2
    target = build(seed=0)
    return {
        "target": target,
        "often": perturbed_copy(target, noise=0.05, seed=1),  # agrees most of the time
        "rarely": build(seed=2),  # an unrelated model: agrees by chance only
        "head": random_eagle_head(target, seed=3),  # a random EAGLE-3 head: agrees by chance only
    }


@pytest.fixture(scope="module")
def references(family, smol_tokenizer):
    """Hugging Face greedy output for each prompt, the ground truth."""
    outputs = {}
    for prompt in PROMPTS:
        ids = smol_tokenizer(prompt)["input_ids"]
        generated = family["target"].generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=NEW_TOKENS, do_sample=False,
        )
        outputs[prompt] = (ids, generated[0, len(ids):].tolist())
    return outputs


def make_drafter(kind, family):
    if kind == "lookup":
        return PromptLookupDrafter()
    if kind == "eagle":
        return EagleDrafter(family["head"])
    if kind == "hybrid":
        return HybridDrafter(EagleDrafter(family["head"]))
    return ModelDrafter(family[kind])


def test_baseline_equals_hf_generate(family, references, smol_tokenizer):
    engine = SpeculativeEngine(family["target"], smol_tokenizer, drafter=None)
    for prompt, (ids, expected) in references.items():
        result = engine.generate(ids, SamplingParams(max_new_tokens=NEW_TOKENS))
        assert result.token_ids == expected
        assert set(result.sources) == {"target"}


# 5 drafters x 4 draft lengths x adaptive on/off x 3 prompts x 2 families = 240 combinations.
@pytest.mark.parametrize(
    "drafter_kind, k, adaptive",
    list(itertools.product(["lookup", "often", "rarely", "eagle", "hybrid"], [1, 3, 5, 8], [True, False])),
)
def test_speculative_equals_hf_generate(family, references, smol_tokenizer, drafter_kind, k, adaptive):
    engine = SpeculativeEngine(
        family["target"], smol_tokenizer, drafter=make_drafter(drafter_kind, family),
        draft_length=k, adaptive=adaptive,
    )
    for prompt, (ids, expected) in references.items():
        result = engine.generate(ids, SamplingParams(max_new_tokens=NEW_TOKENS, seed=len(prompt)))
        assert result.token_ids == expected, (drafter_kind, k, adaptive, prompt)
        assert result.stats.new_tokens == len(expected)


def test_drafts_are_really_used(family, references, smol_tokenizer):
    """Guard against a vacuous identity: the agreeing draft is accepted, the unrelated one mostly not."""
    ids, _ = references[PROMPTS[0]]
    rates = {}
    for kind in ("often", "rarely"):
        engine = SpeculativeEngine(family["target"], smol_tokenizer, drafter=make_drafter(kind, family),
                                   draft_length=3, adaptive=False)  # no timing-dependent gate here
        stats = engine.generate(ids, SamplingParams(max_new_tokens=NEW_TOKENS)).stats
        rates[kind] = stats.acceptance_rate
        assert stats.drafted_tokens > 0
    assert rates["often"] > 0.5 > rates["rarely"]


class CountedHead(EagleDrafter):
    """An EagleDrafter that counts its own verified proposals and those whose first draft was kept
    (in a hybrid, lookup's rounds are not the head's)."""

    def __init__(self, head) -> None:
        super().__init__(head)
        self.proposals = self.first_kept = 0
        self._drafted = False

    def propose(self, *args):
        draft = super().propose(*args)
        self._drafted = bool(draft.tokens)
        return draft

    def propose_tree(self, *args):  # alone on an eager target the head drafts trees
        draft = super().propose_tree(*args)
        self._drafted = bool(draft.tokens)
        return draft

    def accepted(self, n: int) -> None:
        if self._drafted:
            self.proposals += 1
            self.first_kept += n > 0
        self._drafted = False
        super().accepted(n)


def test_an_eagle_head_that_fits_the_target_is_accepted(family, references, smol_tokenizer):
    """A head taught the target's next tokens on these sequences (draft vocabulary: their tokens)
    is accepted at the first draft position: the features, their positions and d2t line up. The
    output stays the target's, with a head kept across replies and in the hybrid too."""
    sequences = [ids + expected for ids, expected in references.values()]
    head = fitted_eagle_head(family["target"], sequences)
    alone, in_hybrid = CountedHead(head), CountedHead(head)
    for drafter, counted in ((alone, alone), (HybridDrafter(in_hybrid), in_hybrid)):
        engine = SpeculativeEngine(family["target"], smol_tokenizer, drafter=drafter, draft_length=2, adaptive=False)
        for ids, expected in references.values():
            # Seeded: the hybrid's choice between its sources then follows acceptance, not timings.
            result = engine.generate(ids, SamplingParams(max_new_tokens=NEW_TOKENS, seed=0))
            assert result.token_ids == expected
            assert "draft" in result.sources
        assert counted.proposals > 0 and counted.first_kept / counted.proposals > 0.6, (
            drafter.name, counted.first_kept, counted.proposals)
