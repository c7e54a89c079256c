"""EAGLE-2 dynamic trees from the EAGLE drafter: the head's tree passes score each node as its
path read as a chain would, the tree respects its budget, and greedy tree rounds give plain
decoding's reply token for token (tiny Llama and Qwen2 with random heads; the real SmolLM2 with
its committed head, fp32 and 4-bit)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdec_core import EagleDrafter, SamplingParams, SpeculativeEngine
from specdec_core.decoding.tree import row_depths
from specdec_core.drafters.eagle import _best_subtree, _Node
from tests.tiny_models import fitted_eagle_head, random_eagle_head, tiny_llama, tiny_qwen2

HEAD = Path(__file__).resolve().parents[1] / "heads" / "smollm2-135m-eagle3"
PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown", "def add(a, b):\n    return a + b\n\ndef"]
NEW_TOKENS = 24


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target(request):
    return (tiny_llama if request.param == "llama" else tiny_qwen2)(seed=0)


def _plain(target, tokenizer, ids, tokens):
    return SpeculativeEngine(target, tokenizer).generate(ids, SamplingParams(max_new_tokens=tokens)).token_ids


def _tree_rounds(engine, ids, tokens, nodes):
    return engine.generate(ids, SamplingParams(max_new_tokens=tokens), tree_nodes=nodes)


def test_best_subtree_keeps_parents_and_the_budget():
    root_a, root_b = _Node(0, 10, None, -0.1), _Node(1, 11, None, -2.0)
    child = _Node(2, 12, root_a, -0.3)
    grandchild = _Node(3, 13, child, -0.3)  # as confident as its parent: the parent still comes first
    leaf_b = _Node(4, 14, root_b, -5.0)
    draft = _best_subtree([root_a, root_b, child, grandchild, leaf_b], nodes=3)
    assert draft.tokens == [10, 12, 13] and draft.parents == [-1, 0, 1] and draft.probs is None
    draft = _best_subtree([root_a, root_b, child, grandchild, leaf_b], nodes=4)
    assert draft.tokens == [10, 11, 12, 13] and draft.parents == [-1, -1, 0, 2]


@pytest.mark.parametrize("nodes, k", [(4, 3), (8, 4), (16, 5)])
def test_trees_within_budget_and_rows_equal_their_paths_as_chains(target, smol_tokenizer, nodes, k):
    """Each node's head output in the tree pass equals the head's output over its path fed as a
    chain: the tree mask and positions are right, so the tree is what chains would draft."""
    drafter = EagleDrafter(random_eagle_head(target, seed=3))
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, draft_length=k, adaptive=False)
    ids = smol_tokenizer(PROMPTS[0])["input_ids"]
    context = ids + engine.generate(ids, SamplingParams(max_new_tokens=3), tree_nodes=nodes).token_ids
    drafter._read(context, drafter._readable(context))  # the features of the reply so far
    pairs = drafter._pairs
    assert drafter._last_out is not None and pairs > len(ids)
    with torch.inference_mode():
        candidates = drafter._grow_tree(k, min(4, nodes), SamplingParams())
        fed = [n for n in candidates if n.out is not None]
        assert fed and max(len(_path(n)) for n in candidates) == k
        for node in fed:
            path = _path(node)
            drafter._cache_crop(pairs)
            out = drafter._last_out
            for step in path:
                embeds = drafter._embed(torch.tensor([[step.token]]))
                out = drafter.head(embeds, out[None, None], drafter._cache)[0, -1]
            torch.testing.assert_close(node.out, out, rtol=1e-4, atol=1e-5)
    drafter._cache_crop(pairs)
    draft = _best_subtree(candidates, nodes)
    assert len(draft.tokens) == min(nodes, len(candidates)) and max(row_depths(draft.parents)) <= k


def _path(node):
    path = []
    while node is not None:
        path.insert(0, node)
        node = node.parent
    return path


@pytest.mark.parametrize("nodes, k, adaptive", [(4, 3, False), (12, 5, False), (64, 8, False), (8, 4, True)])
def test_random_head_tree_rounds_equal_plain_decoding(target, smol_tokenizer, nodes, k, adaptive):
    drafter = EagleDrafter(random_eagle_head(target, seed=3))
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, draft_length=k, adaptive=adaptive)
    for prompt in PROMPTS:
        ids = smol_tokenizer(prompt)["input_ids"]
        result = engine.generate(ids, SamplingParams(max_new_tokens=NEW_TOKENS, seed=0), tree_nodes=nodes)
        assert result.token_ids == _plain(target, smol_tokenizer, ids, NEW_TOKENS)
        if not adaptive:
            assert result.stats.tree_rounds > 0 and result.stats.tree_nodes_verified > result.stats.tree_rounds


def test_fitted_head_trees_accept_deeper_paths_and_stay_exact(target, smol_tokenizer):
    """A head taught the target's next tokens: tree rounds accept, more than one token deep at
    times, and the reply is still plain decoding's."""
    references = []
    for prompt in PROMPTS:
        ids = smol_tokenizer(prompt)["input_ids"]
        references.append((ids, _plain(target, smol_tokenizer, ids, NEW_TOKENS)))
    head = fitted_eagle_head(target, [ids + reply for ids, reply in references])
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=EagleDrafter(head), draft_length=4, adaptive=False)
    for ids, reply in references:
        result = _tree_rounds(engine, ids, NEW_TOKENS, 12)
        assert result.token_ids == reply
        assert result.stats.tree_rounds > 0 and result.stats.tree_accepted_depth > 0


CHAT = "Write a Python function that returns the squares of a list of numbers."


def _chat_ids(tokenizer):
    return tokenizer.apply_chat_template([{"role": "user", "content": CHAT}], add_generation_prompt=True,
                                         return_dict=True)["input_ids"]


def test_committed_head_trees_on_the_fp32_smollm2_equal_plain_decoding(smollm2):
    model, tokenizer = smollm2
    ids, tokens = _chat_ids(tokenizer), 48
    plain = _plain(model, tokenizer, ids, tokens)
    drafter = EagleDrafter.from_pretrained(HEAD)
    chain = SpeculativeEngine(model, tokenizer, drafter=drafter, draft_length=4, adaptive=False)
    chained = _tree_rounds(chain, ids, tokens, 0)
    tree = SpeculativeEngine(model, tokenizer, drafter=EagleDrafter.from_pretrained(HEAD), draft_length=4, adaptive=False)
    grown = _tree_rounds(tree, ids, tokens, 16)
    assert chained.token_ids == plain and grown.token_ids == plain
    assert chained.stats.tree_rounds == 0 and grown.stats.tree_rounds > 0
    # the trained head's tree keeps more per target forward than its chain on this reply
    assert grown.stats.tokens_per_target_forward >= chained.stats.tokens_per_target_forward


def test_committed_head_trees_on_the_4bit_smollm2_equal_plain_decoding(smollm2_local):
    """The offline preset's default 4-bit target (eager, row-exact attention: trees of up to 16
    nodes) and its committed head."""
    models = smollm2_local
    ids, tokens = _chat_ids(models.tokenizer), 48
    baseline = models.make_engine(drafter="none")
    # The session's models keep what earlier tests read: the baseline reads its whole prompt in one
    # call, as the EAGLE engine (which needs the features from the start) does. In one full run
    # (files per worker, --dist loadfile) the baseline's reply, not the tree engine's, turned at
    # token 12; not reproduced alone. The likely cause: it read only what an earlier test's kept
    # cache lacked, a KV computed in other chunks rounds apart, and the engines must read alike
    # (as the app's side by side makes them).
    baseline.forget()
    plain = baseline.generate(ids, SamplingParams(max_new_tokens=tokens)).token_ids
    engine = models.make_engine(drafter="eagle", draft_length=4, adaptive=False)
    result = engine.generate(ids, SamplingParams(max_new_tokens=tokens), tree_nodes=16)
    assert result.token_ids == plain
    assert result.stats.tree_rounds > 0 and result.stats.tree_accepted_depth > result.stats.tree_rounds
