"""Tree drafts: one target forward verifies a tree (tree attention, per-node positions), the
accepted path's keys and values move into place, and greedy output stays Hugging Face's.

The drafter here is an oracle: it knows the target's greedy continuation and plants it in a
random tree down to a depth it chooses each round, every other node a token that can't match,
so each round's accepted depth is known in advance and every depth is both accepted and
rejected over a test."""

from __future__ import annotations

import random

import pytest
import torch

from specdec_core import SamplingParams, SpeculativeEngine
from specdec_core.decoding.eager import CachedModel
from specdec_core.decoding.tree import ancestry, row_depths, tree_attention_mask
from specdec_core.drafter import Draft, Drafter
from tests.tiny_models import tiny_llama, tiny_qwen2

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "def add(a, b):\n    return a + b\n\ndef",
]
NEW_TOKENS = 24


# ---------------------------------------------------------------- tree shapes


def chain_shape(nodes: int, depth: int, rng: random.Random) -> list[int]:
    """A chain written as a tree (parents given): the degenerate case."""
    return list(range(-1, min(nodes, depth) - 1))


def wide_shape(nodes: int, depth: int, rng: random.Random) -> list[int]:
    """Every node a child of the last token: a one-level tree of `nodes` candidates."""
    return [-1] * nodes


def binary_shape(nodes: int, depth: int, rng: random.Random) -> list[int]:
    """Two children per node, level by level (breadth first), down to `depth`."""
    parents, depths = [], []
    for node in range(nodes):
        parent = node // 2 - 1  # rows: -1, -1, 0, 0, 1, 1, ...
        d = 1 if parent < 0 else depths[parent] + 1
        if d > depth:
            break
        parents.append(parent)
        depths.append(d)
    return parents


def random_shape(nodes: int, depth: int, rng: random.Random) -> list[int]:
    """Each node hangs under a random earlier node (or the last token) not yet `depth` deep."""
    parents: list[int] = []
    depths = row_depths(parents)
    for _ in range(nodes):
        parent_row = rng.choice([row for row, d in enumerate(depths) if d < depth])
        parents.append(parent_row - 1)
        depths = row_depths(parents)
    return parents


SHAPES = {"chain": chain_shape, "wide": wide_shape, "binary": binary_shape, "random": random_shape}


class OracleTreeDrafter(Drafter):
    """Proposes random trees holding the target's true continuation down to a chosen depth.

    truth: the whole greedy sequence (prompt + reply). Each round it draws a tree shape, picks a
    node at the next depth in turn (0: none) and gives its path the true tokens; every other node gets a token from
    `decoys`, which hold none of the reply's tokens, so the accepted path is exactly the planted
    one. `planted` and `kept` record each round's planted depth and the path the engine reported."""

    name = "oracle-tree"

    def __init__(self, truth: list[int], shape, nodes: int, decoys: list[int], seed: int) -> None:
        self.truth, self.shape, self.nodes, self.decoys = truth, shape, nodes, decoys
        self.rng = random.Random(seed)
        self.planted: list[int] = []
        self.kept: list[list[int]] = []
        self.budgets: list[int] = []

    def propose_tree(self, context, k, nodes, params, generator) -> Draft:
        self.budgets.append(nodes)
        true_next = self.truth[len(context): len(context) + k]
        parents = self.shape(min(self.nodes, nodes) if nodes else 0, k, self.rng)
        if not parents:  # no room for a tree: an empty draft
            self.planted.append(0)
            return Draft([])
        depths = row_depths(parents)
        # the depths in turn (0: plant nothing), so each generation accepts every depth and rejects below it
        want = len(self.planted) % (max(depths) + 1)
        target = self.rng.choice([node for node in range(-1, len(parents)) if depths[node + 1] == want])
        tokens = [self.rng.choice(self.decoys) for _ in parents]
        path = []
        row = target + 1
        while row > 0:
            path.append(row - 1)
            row = parents[row - 1] + 1
        path.reverse()
        planted = 0
        for node in path:  # the true tokens as far as the reply goes
            if depths[node + 1] - 1 < len(true_next):
                tokens[node] = true_next[depths[node + 1] - 1]
                planted += 1
            else:
                break
        self.planted.append(planted)
        return Draft(tokens, parents=parents)

    def accepted_path(self, nodes: list[int]) -> None:
        self.kept.append(nodes)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target(request):
    return (tiny_llama if request.param == "llama" else tiny_qwen2)(seed=0)


@pytest.fixture(scope="module")
def references(target, smol_tokenizer):
    outputs = []
    for prompt in PROMPTS:
        ids = smol_tokenizer(prompt)["input_ids"]
        generated = target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=NEW_TOKENS, do_sample=False)
        outputs.append((ids, generated[0, len(ids):].tolist()))
    return outputs


def decoys_for(reply: list[int]) -> list[int]:
    return [t for t in range(1000, 1200) if t not in reply]


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("nodes, k", [(6, 3), (12, 5)])
def test_greedy_tree_rounds_equal_hf_generate(target, references, smol_tokenizer, shape, nodes, k):
    seen_depths = set()
    for seed, (ids, expected) in enumerate(references):
        drafter = OracleTreeDrafter(ids + expected, SHAPES[shape], nodes, decoys_for(expected), seed)
        engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, draft_length=k, adaptive=False)
        result = engine.generate(ids, SamplingParams(max_new_tokens=NEW_TOKENS))
        assert result.token_ids == expected
        # each round kept exactly the planted path: every depth accepted where planted, rejected below
        assert [len(path) for path in drafter.kept] == drafter.planted[: len(drafter.kept)]
        seen_depths |= set(drafter.planted)
        assert engine.stats.tree_rounds == len(drafter.kept)
        assert engine.stats.tree_accepted_depth == sum(drafter.planted[: len(drafter.kept)])
    deepest = max(row_depths(SHAPES[shape](nodes, k, random.Random(0)))) if shape in ("wide", "binary") else k
    assert set(range(deepest + 1)) <= seen_depths  # every depth, 0 (all rejected) included


def test_tree_nodes_zero_asks_for_chains(target, references, smol_tokenizer):
    ids, expected = references[0]
    drafter = OracleTreeDrafter(ids + expected, random_shape, 8, decoys_for(expected), seed=0)
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, draft_length=3, adaptive=False)
    result = engine.generate(ids, SamplingParams(max_new_tokens=8), tree_nodes=0)
    assert result.token_ids == expected[:8]
    assert set(drafter.budgets) == {0} and engine.stats.tree_rounds == 0
    engine.generate(ids, SamplingParams(max_new_tokens=8), tree_nodes=5)
    assert set(drafter.budgets) == {0, 5}


def test_a_tree_over_its_budget_is_refused(target, references, smol_tokenizer):
    ids, expected = references[0]

    class Greedy(OracleTreeDrafter):
        def propose_tree(self, context, k, nodes, params, generator):
            return Draft([1000] * (nodes + 1), parents=[-1] * (nodes + 1))

    engine = SpeculativeEngine(target, smol_tokenizer, drafter=Greedy(ids, wide_shape, 4, [1000], 0), draft_length=3)
    with pytest.raises(ValueError, match="at most 4 tokens"):
        engine.generate(ids, SamplingParams(max_new_tokens=4), tree_nodes=4)


class RecordingTreeDrafter(OracleTreeDrafter):
    """The oracle, keeping every tree it proposed."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.drafts: list[Draft] = []

    def propose_tree(self, context, k, nodes, params, generator) -> Draft:
        draft = super().propose_tree(context, k, nodes, params, generator)
        self.drafts.append(draft)
        return draft


def test_the_engine_keeps_the_last_tree_round_and_every_nodes_place(target, references, smol_tokenizer):
    """Stats.last_tree is the last tree verified (tokens, parents, the path kept, the target's
    own token and its source), what the app draws; Stats.node_acceptance counts every drafting
    round's nodes by place, what the tree theory reads."""
    ids, expected = references[0]
    drafter = RecordingTreeDrafter(ids + expected, random_shape, 8, decoys_for(expected), 5)
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, draft_length=3, adaptive=False)
    result = engine.generate(ids, SamplingParams(max_new_tokens=NEW_TOKENS))
    assert result.token_ids == expected
    trees = [draft for draft in drafter.drafts if draft.tokens]
    last, stats = trees[-1], engine.stats
    tree = stats.last_tree
    assert (list(tree.tokens), list(tree.parents), list(tree.path)) == (last.tokens, last.parents, drafter.kept[-1])
    assert tree.source == ("bonus" if last.is_leaf(tree.path[-1] if tree.path else -1) else "resampled")
    # the round gave the path's drafts, then the target's own token, with the sources the chat shows
    gave = ([last.tokens[node] for node in tree.path] + [tree.token], ["draft"] * len(tree.path) + [tree.source])
    n = len(tree.path) + 1
    assert any((result.token_ids[i:i + n], result.sources[i:i + n]) == gave for i in range(len(result.token_ids)))
    nodes = stats.node_acceptance
    assert nodes.tree_rounds == nodes.rounds == stats.tree_rounds
    assert nodes.nodes == stats.tree_nodes_verified
    assert nodes.measured_tokens() == pytest.approx(1 + stats.tree_accepted_depth / stats.tree_rounds)
    assert "last_tree" not in stats.as_dict() and "node_acceptance" not in stats.as_dict()


# ---------------------------------------------------------------- the verify step and compaction


def test_tree_mask_sees_prefix_and_ancestors_only():
    parents = [-1, -1, 0, 0, 2, 1]  # rows 1..6
    sees = ancestry(parents)
    assert sees[5].tolist() == [True, True, False, True, False, True, False]  # node 4: 0 -> 2 -> 4
    assert sees[6].tolist() == [True, False, True, False, False, False, True]  # node 5: 1 -> 5
    mask = tree_attention_mask(parents, cached=3, dtype=torch.float32, device="cpu")
    assert mask.shape == (1, 1, 7, 10)
    assert (mask[0, 0, :, :3] == 0).all()  # the cached prefix: every row
    assert ((mask[0, 0, :, 3:] == 0) == sees).all()


@pytest.mark.parametrize("shape", ["random", "binary"])
def test_each_tree_row_scores_its_path_and_compaction_equals_a_fresh_forward(target, shape):
    rng = random.Random(7)
    prompt = [rng.randrange(3, 5000) for _ in range(9)]
    parents = SHAPES[shape](10, 4, rng)
    tokens = [rng.randrange(3, 5000) for _ in parents]
    runner = CachedModel(target)
    runner.forward(prompt[:-1])
    logits = runner.forward_tree([prompt[-1], *tokens], parents)

    def path_of(node):
        path = []
        while node >= 0:
            path.append(node)
            node = parents[node]
        return path[::-1]

    with torch.no_grad():
        for node in range(-1, len(parents)):
            sequence = prompt + [tokens[i] for i in path_of(node)]
            fresh = target(torch.tensor([sequence])).logits[0, -1]
            torch.testing.assert_close(logits[node + 1], fresh, atol=1e-4, rtol=1e-4)
    deepest = max(range(len(parents)), key=lambda n: (len(path_of(n)), n))
    path = path_of(deepest)
    assert path != list(range(len(path)))  # a path that must move (not a chain's first rows)
    runner.keep_rows(len(prompt) - 1, [0, *(n + 1 for n in path)])
    accepted = prompt + [tokens[i] for i in path]
    assert runner.length == len(accepted)
    with torch.no_grad():
        fresh = target(torch.tensor([accepted]), use_cache=True)
    for layer, (keys, values) in zip(runner.cache.layers, ((l.keys, l.values) for l in fresh.past_key_values.layers)):
        torch.testing.assert_close(layer.keys, keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(layer.values, values, atol=1e-5, rtol=1e-5)
    # and decoding goes on from the compacted cache as from the accepted sequence
    next_logits = runner.forward([4242])
    with torch.no_grad():
        torch.testing.assert_close(next_logits[0], target(torch.tensor([accepted + [4242]])).logits[0, -1],
                                   atol=1e-4, rtol=1e-4)


def test_real_smollm2_tree_rounds_equal_the_baseline(smollm2):
    model, tokenizer = smollm2
    ids = tokenizer("The capital of France is Paris. The capital of Germany is")["input_ids"]
    baseline = SpeculativeEngine(model, tokenizer).generate(ids, SamplingParams(max_new_tokens=16)).token_ids
    drafter = OracleTreeDrafter(ids + baseline, random_shape, 10, decoys_for(baseline), seed=3)
    engine = SpeculativeEngine(model, tokenizer, drafter=drafter, draft_length=4, adaptive=False)
    result = engine.generate(ids, SamplingParams(max_new_tokens=16))
    assert result.token_ids == baseline
    assert [len(p) for p in drafter.kept] == drafter.planted[: len(drafter.kept)]
    assert engine.stats.tree_rounds > 0 and engine.stats.tree_accepted_depth > 0
