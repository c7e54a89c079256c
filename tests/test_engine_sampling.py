"""End to end: sampled speculative output has exactly the target's distribution (statistically).

A tiny-vocabulary target/draft pair with peaked, different distributions; the first two
generated tokens of thousands of seeded runs are compared with the exact target distribution
by a chi-square test. Sampling from the draft instead, or a wrong residual, fails it by far.
"""

from collections import Counter
import dataclasses

import pytest
import torch
from scipy.stats import chisquare

from specdec_core import (EagleDrafter, HybridDrafter, LayerSkipDrafter, MedusaDrafter, ModelDrafter, PromptLookupDrafter,
                          RetrievalDrafter, SamplingParams, SpeculativeEngine)
from specdec_core.drafter import Draft, Drafter
from specdec_core.drafters import Eagle3Head
from specdec_core.drafters.retrieval import Datastore
from specdec_core.sampling import probabilities
from tests.tiny_models import random_medusa_heads, tiny_llama

VOCAB = 8
RUNS = 2000
PROMPT = [5, 3, 6, 4, 7, 5, 3]


@pytest.fixture(scope="module")
def pair():
    # A large init range gives peaked, clearly different distributions over 8 tokens.
    return tiny_llama(seed=0, vocab=VOCAB, init=0.6), tiny_llama(seed=1, vocab=VOCAB, init=0.6)


def exact_two_token_distribution(model, eos_ids, params):
    """P(first two tokens) under the target alone; a reply that starts with EOS has one token."""
    with torch.no_grad():
        first = probabilities(model(torch.tensor([PROMPT])).logits[0, -1], params)
        dist = {}
        for t1 in range(VOCAB):
            if t1 in eos_ids:
                dist[(t1,)] = float(first[t1])
                continue
            second = probabilities(model(torch.tensor([PROMPT + [t1]])).logits[0, -1], params)
            for t2 in range(VOCAB):
                dist[(t1, t2)] = float(first[t1] * second[t2])
    return dist


def empirical(engine, params):
    counts = Counter()
    for seed in range(RUNS):
        counts[tuple(engine.generate(PROMPT, dataclasses.replace(params, max_new_tokens=2, seed=seed)).token_ids)] += 1
    return counts


def drafted_and_accepted(engine, max_new_tokens: int, runs: int = 100) -> tuple[int, int]:
    """Draft tokens proposed and accepted over `runs` seeded replies at temperature 1: a test
    that both are above 0 and apart shows the drafter drafts and is not the target itself."""
    drafted = accepted = 0
    for seed in range(runs):
        stats = engine.generate(PROMPT, SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=seed)).stats
        drafted, accepted = drafted + stats.drafted_tokens, accepted + stats.accepted_tokens
    return drafted, accepted


# The EAGLE head's draft vocabularies: all 8 tokens, and a reduced, shuffled one (q is zero on
# the tokens it lacks; d2t maps the rest).
EAGLE_VOCABULARIES = pytest.mark.parametrize(
    "draft_vocab, params",
    [
        ([0, 1, 2, 3, 4, 5, 6, 7], SamplingParams(temperature=1.0)),
        ([6, 3, 7, 0, 4], SamplingParams(temperature=0.7, top_k=5, top_p=0.9)),
    ],
    ids=["full-vocab-t1", "5-of-8-t0.7-topk5-topp0.9"],
)


def eagle_engine(target, tokenizer, draft_vocab) -> SpeculativeEngine:
    head = Eagle3Head.random(target.config, draft_vocab_size=len(draft_vocab), seed=5)  # init 0.6: peaked
    head.set_draft_vocab(draft_vocab)
    return SpeculativeEngine(target, tokenizer, drafter=EagleDrafter(head), draft_length=2, adaptive=False)


def chi_square_p_value(counts, exact):
    """Cells expected at least 5 times are tested one by one; the rest are pooled into one cell."""
    observed, expected, rest_obs, rest_exp = [], [], 0, 0.0
    for outcome, probability in exact.items():
        if probability * RUNS >= 5:
            observed.append(counts.get(outcome, 0))
            expected.append(probability * RUNS)
        else:
            rest_obs += counts.get(outcome, 0)
            rest_exp += probability * RUNS
    rest_obs += sum(c for o, c in counts.items() if o not in exact)
    if rest_exp > 0:
        observed.append(rest_obs)
        expected.append(rest_exp)
    elif rest_obs:
        return 0.0  # an outcome the target can never produce
    scale = sum(observed) / sum(expected)  # float rounding: the totals must agree exactly
    return chisquare(observed, [e * scale for e in expected]).pvalue


def total_variation(a, b):
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=5, top_p=0.9)],
    ids=["t1", "t0.7-topk5-topp0.9"],
)
def test_model_drafter_samples_the_target_distribution(pair, smol_tokenizer, params):
    target, draft = pair
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=ModelDrafter(draft), draft_length=2, adaptive=False)
    exact = exact_two_token_distribution(target, engine.eos_ids, params)
    draft_alone = exact_two_token_distribution(draft, engine.eos_ids, params)
    assert total_variation(exact, draft_alone) > 0.3, "the draft must differ for the test to have power"

    counts = empirical(engine, params)
    assert engine.stats is not None
    assert chi_square_p_value(counts, exact) > 1e-3
    # And the same check rejects the draft's own distribution, so it can tell them apart.
    assert chi_square_p_value(counts, draft_alone) < 1e-6


def test_prompt_lookup_samples_the_target_distribution(pair, smol_tokenizer):
    """A deterministic drafter (one-hot q) must not bias sampling either."""
    target, _ = pair
    params = SamplingParams(temperature=1.0)
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=PromptLookupDrafter(), draft_length=2, adaptive=False)
    exact = exact_two_token_distribution(target, engine.eos_ids, params)
    counts = empirical(engine, params)
    assert chi_square_p_value(counts, exact) > 1e-3


def test_retrieval_samples_the_target_distribution(pair, smol_tokenizer):
    """A datastore of the target's own samples, as the real one holds its replies (its most
    frequent continuation is often drawn, not always): its deterministic drafts (one-hot q) keep
    the target's distribution. Its copies from the context are prompt lookup's (tested above);
    with 8 tokens the context nearly always has one, so they are switched off here and the
    datastore drafts every round."""
    target, _ = pair
    params = SamplingParams(temperature=1.0)
    writer = SpeculativeEngine(target, smol_tokenizer)
    samples = [PROMPT[-2:] + writer.generate(PROMPT, dataclasses.replace(params, max_new_tokens=6, seed=seed)).token_ids
               for seed in range(50)]
    drafter = RetrievalDrafter(Datastore.from_sequences(samples))
    drafter.lookup = Drafter()  # proposes nothing
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, draft_length=2, adaptive=False)
    exact = exact_two_token_distribution(target, engine.eos_ids, params)
    counts = empirical(engine, params)
    assert chi_square_p_value(counts, exact) > 1e-3
    drafted, accepted = drafted_and_accepted(engine, max_new_tokens=3)  # past its peaked first token
    assert 0 < accepted < drafted


@EAGLE_VOCABULARIES
def test_eagle_head_samples_the_target_distribution(pair, smol_tokenizer, draft_vocab, params):
    target, _ = pair
    engine = eagle_engine(target, smol_tokenizer, draft_vocab)
    exact = exact_two_token_distribution(target, engine.eos_ids, params)
    counts = empirical(engine, params)
    assert chi_square_p_value(counts, exact) > 1e-3
    drafted, accepted = drafted_and_accepted(engine, max_new_tokens=2)
    assert 0 < accepted < drafted  # the head drafts, and it is not the target


def test_hybrid_samples_the_target_distribution(pair, smol_tokenizer):
    target, _ = pair
    params = SamplingParams(temperature=1.0)
    head = Eagle3Head.random(target.config, draft_vocab_size=VOCAB, seed=6)
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=HybridDrafter(EagleDrafter(head)), draft_length=2,
                               adaptive=False)
    exact = exact_two_token_distribution(target, engine.eos_ids, params)
    counts = empirical(engine, params)
    assert chi_square_p_value(counts, exact) > 1e-3


class TreeModelDrafter(Drafter):
    """Samples a tree from a draft model: `widths[d]` children under each node of depth d, drawn
    with or without replacement from the draft's distribution after their path (its logits
    divided by `flatten`; restricted to `draft_vocab`, a reduced vocabulary, when given)."""

    name = "tree-model"

    def __init__(self, model, widths, replace: bool, draft_vocab=None, flatten: float = 1.0) -> None:
        self.model, self.widths, self.replace, self.flatten = model, widths, replace, flatten
        self.allowed = None if draft_vocab is None else torch.zeros(VOCAB, dtype=torch.bool)
        if draft_vocab is not None:
            self.allowed[draft_vocab] = True
        self.depths_kept = Counter()
        self.known = {}  # (path, params) -> q: thousands of replies share a few dozen paths

    def _q(self, sequence, params):
        key = (tuple(sequence), dataclasses.replace(params, seed=None))
        if key not in self.known:
            with torch.no_grad():
                q = probabilities(self.model(torch.tensor([sequence])).logits[0, -1] / self.flatten, params)
            if self.allowed is not None:
                q = q * self.allowed
            self.known[key] = q / q.sum()
        return self.known[key]

    def propose_tree(self, context, k, nodes, params, generator):
        tokens, parents, rows, frontier = [], [], [], [(-1, [])]
        for width in self.widths[:k]:
            next_frontier = []
            for parent, path in frontier:
                left = self._q(context + path, params)
                for _ in range(width):
                    if left.sum() <= 0:
                        break
                    source = left / left.sum()
                    token = int(torch.multinomial(source, 1, generator=generator))
                    tokens.append(token)
                    parents.append(parent)
                    rows.append(source)
                    next_frontier.append((len(tokens) - 1, path + [token]))
                    if not self.replace:
                        left = left.clone()
                        left[token] = 0
            frontier = next_frontier
        return Draft(tokens, probs=torch.stack(rows), parents=parents)

    def accepted_path(self, nodes):
        self.depths_kept[len(nodes)] += 1


@pytest.mark.parametrize(
    "replace, draft_vocab, params",
    [
        (True, None, SamplingParams(temperature=1.0)),
        (False, None, SamplingParams(temperature=0.7, top_k=5, top_p=0.9)),
        (False, [6, 3, 7, 0, 4], SamplingParams(temperature=1.0)),
    ],
    ids=["with-replacement-t1", "without-t0.7-topk5-topp0.9", "without-5-of-8-t1"],
)
def test_tree_drafts_sample_the_target_distribution(pair, smol_tokenizer, replace, draft_vocab, params):
    """Tree rounds (3 candidates, 2 under each) keep the target's distribution: chi-square. The
    draft is the target made 6 times flatter, so every depth is kept now and then."""
    target, _ = pair
    drafter = TreeModelDrafter(target, widths=(3, 2), replace=replace, draft_vocab=draft_vocab, flatten=6.0)
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, draft_length=2, adaptive=False)
    exact = exact_two_token_distribution(target, engine.eos_ids, params)
    counts = Counter()
    for seed in range(RUNS):  # 3 tokens, so the first round drafts two levels: its tokens are the first two
        counts[tuple(engine.generate(PROMPT, dataclasses.replace(params, max_new_tokens=3, seed=seed)).token_ids[:2])] += 1
    assert chi_square_p_value(counts, exact) > 1e-3
    flat = dataclasses.replace(params, temperature=params.temperature * 6)
    assert chi_square_p_value(counts, exact_two_token_distribution(target, engine.eos_ids, flat)) < 1e-6
    assert {0, 1, 2} <= set(drafter.depths_kept)  # rejected, one level kept, two kept: all happen


@pytest.mark.parametrize(
    "own_output, params",
    [(True, SamplingParams(temperature=1.0)), (False, SamplingParams(temperature=0.7, top_k=5, top_p=0.9))],
    ids=["own-output-t1", "target-lm-head-t0.7-topk5-topp0.9"],
)
def test_medusa_heads_sample_the_target_distribution(pair, smol_tokenizer, own_output, params):
    """Each draft token drawn from its head's distribution (which doesn't see the tokens drafted
    before it), warped as the target's: q is what the token was drawn from, so the output keeps
    the target's distribution. Three tokens so the second head's drafts are verified too."""
    target, _ = pair
    # Peaked random heads; seeds whose drafts the target sometimes keeps (many random heads over
    # the target's lm_head put q on tokens it never picks: the test would see no acceptance).
    seed, std = (7, 0.6) if own_output else (2, 1.0)
    heads = random_medusa_heads(target, num_heads=2, own_output=own_output, seed=seed, std=std)
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=MedusaDrafter(heads), draft_length=2, adaptive=False)
    exact = exact_two_token_distribution(target, engine.eos_ids, params)
    counts = empirical(engine, params)
    assert chi_square_p_value(counts, exact) > 1e-3
    drafted, accepted = drafted_and_accepted(engine, max_new_tokens=3)
    assert 0 < accepted < drafted  # the heads draft, and they are not the target


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=5, top_p=0.9)],
    ids=["t1", "t0.7-topk5-topp0.9"],
)
def test_layer_skip_samples_the_target_distribution(pair, smol_tokenizer, params):
    """The target's first layer alone (then its norm and head) drafts: q differs from p, and the
    acceptance rule still gives exactly p."""
    target, _ = pair
    drafter = LayerSkipDrafter(kept_layers=(0,))
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, draft_length=2, adaptive=False)
    exact = exact_two_token_distribution(target, engine.eos_ids, params)
    assert total_variation(exact, exact_two_token_distribution(drafter.model, engine.eos_ids, params)) > 0.1
    counts = empirical(engine, params)
    assert chi_square_p_value(counts, exact) > 1e-3
    drafted, accepted = drafted_and_accepted(engine, max_new_tokens=2)
    assert 0 < accepted < drafted


@EAGLE_VOCABULARIES
def test_eagle_trees_sample_the_target_distribution(pair, smol_tokenizer, draft_vocab, params):
    """The EAGLE head's dynamic trees (its most confident nodes, sent as a deterministic draft)
    keep the target's distribution: chi-square over the first two tokens of the first round,
    which drafts a tree two levels deep."""
    target, _ = pair
    engine = eagle_engine(target, smol_tokenizer, draft_vocab)
    exact = exact_two_token_distribution(target, engine.eos_ids, params)
    counts, tree_rounds, kept = Counter(), 0, Counter()
    for seed in range(RUNS):
        result = engine.generate(PROMPT, dataclasses.replace(params, max_new_tokens=3, seed=seed), tree_nodes=6)
        counts[tuple(result.token_ids[:2])] += 1
        tree_rounds += result.stats.tree_rounds
        kept[result.stats.rounds[0][1]] += 1
    assert chi_square_p_value(counts, exact) > 1e-3
    assert tree_rounds >= RUNS  # every first round verified a tree
    if len(draft_vocab) == VOCAB:  # (the 5-token vocabulary misses the warped target's few likely tokens)
        assert {0, 1, 2} <= set(kept)  # rejected, one level kept, two kept: all happen
