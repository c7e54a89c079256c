"""Medusa heads: their checkpoint format (ours and the published one), the feature they read (the
target's last layer's output), the drafter, and candidate trees from ranked guesses."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec_core import SamplingParams
from specdec_core.decoding.features import StepFeatures, feature_tap, untapped
from specdec_core.drafters import MedusaDrafter, MedusaHeads
from specdec_core.drafters.candidate_tree import best_paths, candidate_tree
from specdec_core.errors import LoadError
from tests.tiny_models import FOLDER_DAMAGES, damaged_folder, final_hidden_states, random_medusa_heads, tiny_llama, write_published_medusa


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, vocab=300)


# ---------------------------------------------------------------- the format


@pytest.mark.parametrize("own_output", [True, False], ids=["own-output", "target-lm-head"])
def test_heads_round_trip_in_medusas_layout_with_the_same_outputs(tmp_path, target, own_output):
    heads = random_medusa_heads(target, num_heads=3, own_output=own_output, seed=1)
    heads.save(tmp_path, dtype=None)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["medusa_num_heads"] == 3 and config["medusa_num_layers"] == 1
    names = set(load_file(str(tmp_path / "medusa_lm_head.safetensors")))
    expected = {f"{i}.0.linear.{p}" for i in range(3) for p in ("weight", "bias")}
    assert names == (expected | {f"{i}.1.weight" for i in range(3)} if own_output else expected)
    loaded = MedusaHeads.load(tmp_path)
    assert (loaded.num_heads, loaded.num_layers, loaded.own_output) == (3, 1, own_output)
    final = final_hidden_states(target, [5, 6, 7, 8])
    lm_head = target.get_output_embeddings()
    with torch.no_grad():
        assert torch.equal(loaded.logits(final, lm_head), heads.logits(final, lm_head))


def test_the_published_layout_loads(tmp_path, target):
    """Medusa's published checkpoints: medusa_lm_head.pt (a pickled state dict, fp16), a config
    with more keys than ours, a file with more heads than the config uses, or a whole model's prefix."""
    heads = random_medusa_heads(target, num_heads=5, seed=2)
    write_published_medusa(tmp_path / "pt", heads)
    loaded = MedusaHeads.load(tmp_path / "pt")
    assert (loaded.num_heads, loaded.own_output, loaded.dtype) == (5, True, torch.float16)
    final = final_hidden_states(target, [5, 6, 7, 8])
    with torch.no_grad():
        torch.testing.assert_close(loaded.float().logits(final), heads.logits(final), atol=2e-2, rtol=1e-2)

    fewer = tmp_path / "pt"
    config = json.loads((fewer / "config.json").read_text())
    (fewer / "config.json").write_text(json.dumps({**config, "medusa_num_heads": 3}))
    assert MedusaHeads.load(fewer).num_heads == 3  # Medusa, too, loads the first heads only

    prefixed = tmp_path / "prefixed"
    heads.save(prefixed)
    tensors = load_file(str(prefixed / "medusa_lm_head.safetensors"))
    save_file({f"medusa_head.{k}": v for k, v in tensors.items()}, str(prefixed / "medusa_lm_head.safetensors"))
    assert MedusaHeads.load(prefixed).num_heads == 5


MEDUSA_DAMAGES = {"not_medusa": lambda config: {"architectures": ["LlamaForCausalLM"]},
                  "wrong_layers": lambda config: {**config, "medusa_num_layers": 2}}


@pytest.mark.parametrize("damage", [*FOLDER_DAMAGES, *MEDUSA_DAMAGES])
def test_broken_heads_fail_with_one_line(tmp_path, target, damage):
    random_medusa_heads(target, num_heads=2).save(tmp_path / "heads")
    folder = damaged_folder(tmp_path / "heads", damage, "medusa_lm_head.safetensors", MEDUSA_DAMAGES)
    with pytest.raises(LoadError) as raised:
        MedusaHeads.load(folder)
    assert "\n" not in str(raised.value) and "Medusa heads" in str(raised.value)


def test_heads_for_another_target_are_refused_in_one_line(target):
    wide = MedusaHeads.random(2, 1, 96, None)
    with pytest.raises(LoadError, match="96 wide but the target's are 64"):
        MedusaDrafter(wide).bind(target, None)
    other_vocab = MedusaHeads.random(2, 1, 64, 500)
    with pytest.raises(LoadError, match="500 tokens but the target's vocabulary has 300"):
        MedusaDrafter(other_vocab).bind(target, None)


# ---------------------------------------------------------------- the feature


def test_the_feature_after_the_last_layer_is_what_the_final_norm_reads(target):
    """Feature layer num_hidden_layers: the last layer's output, the final norm's input; the norm
    of it is the model's last hidden state. An untapped twin never writes it into the model's
    tap, and compiled steps' hooks (StepFeatures) return it."""
    layers = target.config.num_hidden_layers
    tap = feature_tap(target, (layers,))
    ids = [5, 6, 7, 8, 9]
    tap.start()
    expected = final_hidden_states(target, ids)
    captured = tap.take()
    assert captured.shape == (len(ids), 64)
    with torch.no_grad():
        torch.testing.assert_close(target.model.norm(captured), expected)

    twin = untapped(target)
    assert twin.model.norm is not target.model.norm and twin.model.norm.weight is target.model.norm.weight
    returned = StepFeatures(twin, (layers,))
    tap.start()
    with torch.no_grad():
        twin(torch.tensor([ids]))
    assert tap.take() is None  # the twin left the model's tap alone
    (from_twin,) = returned.take()
    torch.testing.assert_close(from_twin, captured)
    with pytest.raises(ValueError, match="outside the target's"):
        feature_tap(target, (layers + 1,))
    # A model with no tap there: its twin shares the norm unless the twin's own steps read it.
    fresh = tiny_llama(seed=1, vocab=300)
    assert untapped(fresh).model.norm is fresh.model.norm
    assert untapped(fresh, (layers,)).model.norm is not fresh.model.norm


# ---------------------------------------------------------------- the drafter


def test_the_drafter_reads_the_hidden_state_of_the_last_position_the_target_read(target):
    """propose() drafts from the row at len(context) - 2 only: head i's top guess for the token i
    + 1 after the context's last one; a context whose row it lacks gets no draft."""
    heads = random_medusa_heads(target, num_heads=3, seed=3, std=0.3)
    drafter = MedusaDrafter(heads)
    drafter.bind(target, None)
    context = [5, 6, 7, 8, 9]
    drafter.reset(context)
    assert drafter.features_from() == len(context) - 2
    layers = target.config.num_hidden_layers
    tap = feature_tap(target, (layers,))
    tap.start()
    final_hidden_states(target, context[:-1])
    drafter.observe(tap.take(), 0)
    greedy = SamplingParams()
    draft = drafter.propose(context, 5, greedy, torch.Generator())
    with torch.no_grad():
        expected = heads.logits(final_hidden_states(target, context[:-1])[-1:], target.lm_head)[:, 0].argmax(-1)
    assert draft.tokens == expected.tolist() and draft.probs is None  # 3 heads: at most 3 tokens
    assert drafter.propose(context, 2, greedy, torch.Generator()).tokens == expected.tolist()[:2]
    assert drafter.propose(context + [4], 3, greedy, torch.Generator()).tokens == []
    sampled = drafter.propose(context, 3, SamplingParams(temperature=0.7), torch.Generator().manual_seed(0))
    assert sampled.probs.shape == (3, 300) and torch.allclose(sampled.probs.sum(-1), torch.ones(3))
    tree = drafter.propose_tree(context, 3, 7, greedy, torch.Generator())
    assert len(tree.tokens) == 7 and tree.parents[0] == -1 and tree.tokens[0] == draft.tokens[0] and tree.depth <= 3
    assert drafter.propose_tree(context, 3, 0, greedy, torch.Generator()).parents is None  # no room: the chain


@pytest.mark.parametrize("own_output", [True, False], ids=["own-output", "target-lm-head"])
def test_heads_with_a_draft_vocabulary_guess_among_it_reading_those_rows_only(tmp_path, target, own_output):
    """Heads saved with their draft vocabulary (draft_vocab.json) load with it; the drafter reads
    out only those rows of the target's lm_head, its logits there those of the whole readout and
    -inf elsewhere, so greedy, sampled and tree drafts all come from the vocabulary."""
    heads = random_medusa_heads(target, num_heads=3, own_output=own_output, seed=4, std=0.3)
    heads.draft_token_ids = list(range(0, 300, 3))
    heads.save(tmp_path, dtype=None)
    assert json.loads((tmp_path / "draft_vocab.json").read_text())["token_ids"] == list(range(0, 300, 3))
    loaded = MedusaHeads.load(tmp_path)
    assert loaded.draft_token_ids == heads.draft_token_ids
    drafter = MedusaDrafter(loaded)
    drafter.bind(target, None)
    context = [5, 6, 7, 8, 9]
    drafter.reset(context)
    tap = feature_tap(target, (target.config.num_hidden_layers,))
    tap.start()
    final_hidden_states(target, context[:-1])
    drafter.observe(tap.take(), 0)
    with torch.no_grad():
        whole = heads.logits(final_hidden_states(target, context[:-1])[-1:], target.lm_head)[:, 0]
    ids = torch.tensor(heads.draft_token_ids)
    logits = drafter._logits(3)
    torch.testing.assert_close(logits[:, ids], whole[:, ids])
    outside = torch.ones(300, dtype=torch.bool)
    outside[ids] = False
    assert torch.isinf(logits[:, outside]).all()
    greedy = drafter.propose(context, 3, SamplingParams(), torch.Generator())
    assert greedy.tokens == ids[whole[:, ids].argmax(-1)].tolist()
    sampled = drafter.propose(context, 3, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert all(t % 3 == 0 for t in sampled.tokens) and float(sampled.probs[:, outside].sum()) == 0
    tree = drafter.propose_tree(context, 3, 7, SamplingParams(), torch.Generator())
    assert all(t % 3 == 0 for t in tree.tokens)


def test_a_broken_or_foreign_draft_vocabulary_is_refused_in_one_line(tmp_path, target):
    heads = random_medusa_heads(target, num_heads=2, own_output=False, seed=5)
    heads.save(tmp_path)
    (tmp_path / "draft_vocab.json").write_text('{"token_ids": "all"}')
    with pytest.raises(LoadError, match="is not a draft vocabulary") as raised:
        MedusaHeads.load(tmp_path)
    assert "\n" not in str(raised.value)
    (tmp_path / "draft_vocab.json").write_text('{"token_ids": [1, 2, 999]}')
    with pytest.raises(LoadError, match="up to id 999 but the target's vocabulary has 300"):
        MedusaDrafter(MedusaHeads.load(tmp_path)).bind(target, None)


# ---------------------------------------------------------------- candidate trees


def test_one_guess_per_depth_gives_a_chain():
    tokens, parents = candidate_tree([[11], [12], [13]], [[0.9], [0.5], [0.4]], budget=10)
    assert tokens == [11, 12, 13] and parents == [-1, 0, 1]


def test_the_tree_holds_the_most_likely_combinations_parents_first():
    guesses = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    scores = [[0.6, 0.25, 0.15], [0.5, 0.4, 0.1], [0.7, 0.2, 0.1]]
    tokens, parents = candidate_tree(guesses, scores, budget=6)
    assert len(tokens) == 6 and all(p < i for i, p in enumerate(parents))  # topological
    # Medusa's rule, by hand: (0) .6, (0,0) .3, (1) .25, (0,1) .24, (0,0,0) .21, (0,1,0) .168
    assert tokens == [10, 20, 11, 21, 30, 30] and parents == [-1, 0, -1, 0, 1, 3]


@pytest.mark.parametrize("seed", range(5))
def test_best_paths_are_the_budget_best_by_brute_force(seed):
    rng = random.Random(seed)
    scores = [sorted((rng.uniform(0.01, 1) for _ in range(3)), reverse=True) for _ in range(3)]
    every = [p for d in (1, 2, 3) for p in itertools.product(range(3), repeat=d)]
    value = {p: math.prod(scores[d][r] for d, r in enumerate(p)) for p in every}
    for budget in (1, 4, 9, 39):
        chosen = best_paths(scores, budget)
        assert len(chosen) == min(budget, len(every)) and len(set(chosen)) == len(chosen)
        assert all(p[:-1] == () or p[:-1] in chosen[: chosen.index(p)] for p in chosen)  # parents first
        worst_in = min(value[p] for p in chosen)
        assert all(value[p] <= worst_in + 1e-12 for p in every if p not in chosen)


def test_bad_scores_are_refused():
    with pytest.raises(ValueError, match="ranked"):
        best_paths([[0.2, 0.5]], 3)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        best_paths([[1.5]], 3)
