"""Row-exact attention (specdec_core/kernels/row_attention.py): each row of a verify step scores bitwise as
a 1-token step does, so greedy speculation on a bf16-rounding target stays token-for-token exact."""

from __future__ import annotations

import pytest
import torch

from specdec_core.kernels.int4_linear import kernel_problem, quantise_linear_layers
from specdec_core.kernels.row_attention import MAX_ROWS, use_row_exact_attention, uses_row_exact_attention, why_not_row_exact
from specdec_core.decoding.eager import CachedModel
from tests.tiny_models import require, tiny_llama, tiny_qwen2

VOCAB = 512


def _int4_tiny_llama(seed: int):
    """A tiny Llama whose linear layers, head included, run on the int4 kernel (Q4_1 blocks of
    its own random weights): every part but attention computes each row alone."""
    problem = kernel_problem()
    require(problem is None, f"torch's int4 CPU kernel is needed here: {problem}")
    model = tiny_llama(seed, vocab=VOCAB, init=0.2)
    assert quantise_linear_layers(model) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer; the head
    return model


def _one_token_steps(model, prompt: list[int], tokens: list[int]) -> list[torch.Tensor]:
    runner = CachedModel(model)
    runner.forward(prompt, last_only=True)
    return [runner.forward([token])[0] for token in tokens]


def test_every_row_of_a_verify_step_is_bitwise_a_one_token_steps_row():
    model = _int4_tiny_llama(seed=3)
    assert use_row_exact_attention(model) is None and uses_row_exact_attention(model)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, VOCAB, (40,), generator=generator).tolist()  # read as a prompt: > MAX_ROWS
    tokens = torch.randint(0, VOCAB, (30,), generator=generator).tolist()
    expected = _one_token_steps(model, prompt, tokens)
    for size in (2, 5, 9, MAX_ROWS):
        runner = CachedModel(model)
        runner.forward(prompt, last_only=True)
        start = 0
        while start < len(tokens):  # steps of `size` tokens, each row checked
            rows = runner.forward(tokens[start : start + size])
            for i, row in enumerate(rows):
                assert torch.equal(row, expected[start + i]), (size, start + i)
            start += size


def test_it_computes_the_same_attention_as_the_stock_path():
    """On an fp32 model the two agree up to float rounding, for prompts and for short steps."""
    stock, exact = tiny_llama(seed=5, vocab=VOCAB, init=0.2), tiny_llama(seed=5, vocab=VOCAB, init=0.2)
    assert use_row_exact_attention(exact) is None
    tokens = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(1)).tolist()
    for model_logits in zip(*[_chunked_logits(model, tokens, [30, 1, 9, 4, MAX_ROWS - 1]) for model in (stock, exact)]):
        torch.testing.assert_close(*model_logits, rtol=1e-4, atol=1e-5)


def _chunked_logits(model, tokens: list[int], sizes: list[int]) -> list[torch.Tensor]:
    runner, start, out = CachedModel(model), 0, []
    for size in sizes:
        out.append(runner.forward(tokens[start : start + size]))
        start += size
    return out


def test_a_model_with_sliding_window_layers_keeps_the_stock_attention():
    model = tiny_qwen2(seed=0, vocab=VOCAB, use_sliding_window=True, sliding_window=16, max_window_layers=0)
    assert why_not_row_exact(model) is not None
    assert use_row_exact_attention(model) == why_not_row_exact(model)
    assert not uses_row_exact_attention(model)
    assert why_not_row_exact(tiny_qwen2(seed=0, vocab=VOCAB)) is None  # use_sliding_window defaults to off


def test_a_left_padded_batch_generates_what_each_sequence_generates_alone():
    """The EAGLE trainer generates its data in left-padded batches: the padding must stay masked
    (the row path, made for the engine's batch-1 steps, would attend to it)."""
    model = tiny_llama(seed=7, vocab=VOCAB, init=0.2)
    assert use_row_exact_attention(model) is None
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, VOCAB, (n,), generator=generator).tolist() for n in (12, 5, 9)]
    width = max(map(len, prompts))
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    settings = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    batched = model.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)[:, width:]
    for prompt, row in zip(prompts, batched.tolist()):
        alone = model.generate(input_ids=torch.tensor([prompt]), **settings)[0, len(prompt):].tolist()
        assert row == alone


def _path_of(node: int, parents: list[int]) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("lean", [False, True], ids=["transformers-layers", "lean-layers"])
def test_every_row_of_a_tree_step_is_bitwise_its_paths_one_token_step(lean):
    """A tree's verify step (each row attending to the prefix and its own ancestors) scores every
    node bitwise as plain decoding of its path does, and after keeping a path the cache goes on
    bitwise as plain decoding's: greedy tree rounds stay exact on the 4-bit target."""
    from specdec_core.kernels.lean_layers import use_lean_layers, uses_lean_layers

    # widths whose int4 blocks stack (as tests/test_lean_layers.py's), so lean layers take the steps
    model = tiny_llama(4, vocab=VOCAB, init=0.2, hidden_size=128, intermediate_size=256, num_attention_heads=2,
                       num_key_value_heads=1)
    assert quantise_linear_layers(model) == 2 * 7 + 1
    assert use_row_exact_attention(model) is None
    if lean:
        assert use_lean_layers(model) is None and uses_lean_layers(model)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (40,), generator=generator).tolist()
    parents = [-1, -1, 0, 0, 1, 2, 2, 4, 5, 5, -1, 10, 3, 8, 13, 14]  # 16 nodes, 6 deep
    tokens = torch.randint(0, VOCAB, (len(parents),), generator=generator).tolist()
    runner = CachedModel(model)
    assert runner.max_tree_nodes == MAX_ROWS - 1
    runner.forward(prompt[:-1], last_only=True)
    rows = runner.forward_tree([prompt[-1], *tokens], parents)
    for node in range(-1, len(parents)):
        path = [tokens[i] for i in _path_of(node, parents)]
        plain = _one_token_steps(model, prompt[:-1], [prompt[-1], *path])[-1]
        assert torch.equal(rows[node + 1], plain), node
    path = _path_of(14, parents)  # 0 -> 2 -> 5 -> 8 -> 13 -> 14: rows that must move
    runner.keep_rows(len(prompt) - 1, [0, *(n + 1 for n in path)])
    after = runner.forward([7, 9])
    plain = _one_token_steps(model, prompt[:-1], [prompt[-1], *(tokens[i] for i in path), 7, 9])
    assert torch.equal(after[0], plain[-2]) and torch.equal(after[1], plain[-1])
