"""Greedy speculative output is token-for-token the baseline's and Hugging Face generate()'s."""

import itertools

import pytest
import torch

from specdec_core import (
    EagleDrafter,
    HybridDrafter,
    LayerSkipDrafter,
    MedusaDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    SamplingParams,
    SpeculativeEngine,
)
from tests.tiny_models import (
    fitted_eagle_head,
    fitted_medusa_heads,
    perturbed_copy,
    random_eagle_head,
    random_medusa_heads,
    tiny_llama,
    tiny_qwen2,
)

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
        "medusa": random_medusa_heads(target, num_heads=4, seed=4),  # random Medusa heads: likewise
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
    if kind == "medusa":
        return MedusaDrafter(family["medusa"])
    if kind == "layer_skip":
        return LayerSkipDrafter(kept_layers=(0,))  # the target's first layer of two, its norm and head
    return ModelDrafter(family[kind])


def test_baseline_equals_hf_generate(family, references, smol_tokenizer):
    engine = SpeculativeEngine(family["target"], smol_tokenizer, drafter=None)
    for prompt, (ids, expected) in references.items():
        result = engine.generate(ids, SamplingParams(max_new_tokens=NEW_TOKENS))
        assert result.token_ids == expected
        assert set(result.sources) == {"target"}


# 6 drafters x 4 draft lengths x adaptive on/off x 3 prompts x 2 families = 288 combinations.
@pytest.mark.parametrize(
    "drafter_kind, k, adaptive",
    list(itertools.product(["lookup", "often", "rarely", "eagle", "hybrid", "medusa", "layer_skip"], [1, 3, 5, 8], [True, False])),
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


def test_layer_skip_drafts_with_the_targets_own_weights_and_a_cache_of_its_layers(family, references, smol_tokenizer):
    """No second copy: every parameter the skipping drafter runs is one of the target's tensors
    (the skipped layer's are not among them), and its KV cache holds only the layer it runs. Its
    drafts are used (the first layer alone agrees with the target part of the time)."""
    target = family["target"]
    drafter = LayerSkipDrafter(kept_layers=(0,))
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, draft_length=3, adaptive=False)
    target_tensors = {id(p): p.data_ptr() for p in target.parameters()}
    runs = list(drafter.model.parameters())
    assert runs and all(id(p) in target_tensors and target_tensors[id(p)] == p.data_ptr() for p in runs)
    assert not {id(p) for p in target.model.layers[1].parameters()} & {id(p) for p in runs}
    assert drafter.model.get_output_embeddings().weight is target.get_output_embeddings().weight
    drafted = accepted = 0
    for ids, expected in references.values():
        result = engine.generate(ids, SamplingParams(max_new_tokens=NEW_TOKENS))
        assert result.token_ids == expected
        drafted, accepted = drafted + result.stats.drafted_tokens, accepted + result.stats.accepted_tokens
    assert 0 < accepted < drafted
    layers = drafter._kept_runner._runner.cache.layers
    assert [layer.is_initialized for layer in layers] == [True, False]  # layer 1's slot stays empty
    assert 0 < drafter.memory_bytes()


@pytest.mark.parametrize("min_speedup, drafts", [(0.0, True), (1e9, False)])
def test_layer_skip_calibrates_at_bind_and_drafts_only_when_a_subset_pays(
        family, references, smol_tokenizer, monkeypatch, min_speedup, drafts):
    from specdec_core.drafters import layer_skip

    monkeypatch.setattr(layer_skip, "MIN_SPEEDUP", min_speedup)
    drafter = LayerSkipDrafter()
    engine = SpeculativeEngine(family["target"], smol_tokenizer, drafter=drafter, draft_length=3, adaptive=False)
    calibration = drafter.calibration
    assert [score.pattern.kept for score in calibration.scores] == [(0,)]  # a 2-layer stack: exit after the first
    score = calibration.scores[0]
    assert 0 <= score.acceptance <= 1 and score.cost > 0 and score.speedup > 0 and 1 <= score.draft_length <= 8
    assert calibration.target_step_s > 0 and min(calibration.verify_cost.values()) >= 1.0
    assert (calibration.chosen is score) == drafts and (drafter.kept == (0,)) == drafts
    assert "acceptance" in calibration.line() and ("drafts nothing" in calibration.line()) != drafts
    ids, expected = references[PROMPTS[0]]
    result = engine.generate(ids, SamplingParams(max_new_tokens=NEW_TOKENS))
    assert result.token_ids == expected
    assert (result.stats.drafted_tokens > 0) == drafts


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


@pytest.fixture(scope="module")
def two_fitted_heads(family, references):
    """Two Medusa heads taught that head i at position t gives token t + 2 + i of the references."""
    return fitted_medusa_heads(family["target"], [ids + expected for ids, expected in references.values()], num_heads=2)


def test_medusa_heads_that_fit_the_target_are_accepted(family, references, smol_tokenizer, two_fitted_heads):
    """Heads taught that head i at position t gives token t + 2 + i are accepted at every draft
    position, across replies: the hidden state's position and the heads' offsets line up (an
    off-by-one would leave them unaccepted). The output stays the target's."""
    drafter = MedusaDrafter(two_fitted_heads)
    engine = SpeculativeEngine(family["target"], smol_tokenizer, drafter=drafter, draft_length=2, adaptive=False)
    drafted = accepted = 0
    for ids, expected in references.values():
        result = engine.generate(ids, SamplingParams(max_new_tokens=NEW_TOKENS, seed=0), tree_nodes=0)  # chains
        assert result.token_ids == expected
        drafted, accepted = drafted + result.stats.drafted_tokens, accepted + result.stats.accepted_tokens
    assert drafted > 0 and accepted / drafted > 0.8, (accepted, drafted)


def test_plain_rounds_keep_measuring_heads_the_policy_takes_as_free(family, references, smol_tokenizer, two_fitted_heads,
                                                                   monkeypatch):
    """Where the heads cost under a twentieth of a target step (fp32 SmolLM2), the policy counts
    them free: never probed, kept current by a guess each plain round, compared with the target's
    token. The heads guess from the row before the round's features; asked after them, they had
    no row for the context and guessed nothing, so their acceptance froze and, once it read as
    not paying, they never drafted again (fp32 bench: 8 tokens drafted in 3,094 forwards)."""
    engine = SpeculativeEngine(family["target"], smol_tokenizer, drafter=MedusaDrafter(two_fitted_heads), draft_length=2)
    policy, seen = engine.policy, []
    monkeypatch.setattr(policy, "next_draft_length", lambda *args: 0)  # plain rounds only
    monkeypatch.setattr(policy, "drafting_is_free", lambda: True)
    monkeypatch.setattr(policy, "observe_unverified", seen.append)
    for ids, expected in references.values():
        assert engine.generate(ids, SamplingParams(max_new_tokens=NEW_TOKENS)).token_ids == expected
    rounds = sum(len(expected) for _, expected in references.values())
    assert len(seen) >= rounds - len(references), (len(seen), rounds)  # every round, but perhaps a reply's last
    assert sum(seen) / len(seen) > 0.8  # the fitted heads' guesses, compared with the right token


@pytest.mark.parametrize("fitted", [True, False], ids=["fitted-heads", "random-heads"])
def test_medusa_trees_equal_the_baseline(family, references, smol_tokenizer, fitted):
    """Greedy rounds verify the heads' candidate trees (top guesses of each head combined): the
    output stays the target's, whether the heads fit it (the top path kept) or not (mostly
    rejected, now and then a second guess kept)."""
    sequences = [ids + expected for ids, expected in references.values()]
    heads = (fitted_medusa_heads(family["target"], sequences, num_heads=3) if fitted
             else random_medusa_heads(family["target"], num_heads=3, seed=5, std=0.3))
    engine = SpeculativeEngine(family["target"], smol_tokenizer, drafter=MedusaDrafter(heads), draft_length=3,
                               adaptive=False)
    tree_rounds = 0
    for ids, expected in references.values():
        result = engine.generate(ids, SamplingParams(max_new_tokens=NEW_TOKENS), tree_nodes=9)
        assert result.token_ids == expected
        tree_rounds += result.stats.tree_rounds
    assert tree_rounds > 0
