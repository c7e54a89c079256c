"""The accept/reject rule with hand-written and random distributions, no models."""

import pytest
import torch

from specdec_core import SamplingParams
from specdec_core.acceptance import greedy_accept, residual_distribution, speculative_accept
from specdec_core.sampling import probabilities


def output_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Exact distribution of one speculative step's first token, computed analytically.

    A draft x ~ q is kept with probability min(1, p(x)/q(x)); otherwise the token comes from
    the residual. P(out = y) = q(y) min(1, p(y)/q(y)) + P(reject) * residual(y).
    """
    ratio = torch.where(q > 0, p / q, torch.ones_like(p)).clamp(max=1)
    kept = q * ratio
    return kept + (1 - kept.sum()) * residual_distribution(p, q)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("warped", [False, True])
def test_output_distribution_is_exactly_p(seed, warped):
    torch.manual_seed(seed)
    vocab = 12
    p_logits, q_logits = torch.randn(vocab) * 2, torch.randn(vocab) * 2
    params = SamplingParams(temperature=0.8, top_k=6, top_p=0.85) if warped else SamplingParams(temperature=1.0)
    p, q = probabilities(p_logits, params), probabilities(q_logits, params)
    assert torch.allclose(output_distribution(p, q), p, atol=1e-6)


def test_residual_is_positive_part_normalised_and_falls_back_to_p():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.4, 0.2, 0.2])
    assert torch.allclose(residual_distribution(p, q), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert torch.equal(residual_distribution(p, p), p)


def test_greedy_accept_prefix_then_correction_or_bonus():
    target_choice = torch.tensor([5, 6, 7, 8])
    assert greedy_accept(target_choice, [5, 6, 9]) == (2, 7)
    assert greedy_accept(target_choice, [4, 6, 7]) == (0, 5)
    assert greedy_accept(target_choice, [5, 6, 7]) == (3, 8)
    assert greedy_accept(torch.tensor([3]), []) == (0, 3)


def test_certain_rejection_and_certain_acceptance():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    assert speculative_accept(p, q, [0], g) == (0, 1)  # p(x) = 0: always rejected, residual is token 1
    q_same = torch.tensor([[0.0, 1.0, 0.0]])
    n, _ = speculative_accept(p, q_same, [1], g)
    assert n == 1  # p(x) = q(x) = 1: always accepted, then a bonus from p[1]


def test_monte_carlo_matches_p_over_two_positions():
    """The implementation itself (not the formula): first-token frequencies match p[0]."""
    torch.manual_seed(1)
    vocab, trials = 6, 20000
    p = torch.softmax(torch.randn(3, vocab) * 2, -1)
    q = torch.softmax(torch.randn(2, vocab) * 2, -1)
    g = torch.Generator().manual_seed(2)
    counts = torch.zeros(vocab)
    for _ in range(trials):
        drafts = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(2)]
        n, token = speculative_accept(p, q, drafts, g)
        counts[drafts[0] if n >= 1 else token] += 1
    total_variation = 0.5 * (counts / trials - p[0]).abs().sum()
    assert total_variation < 0.02
    assert 0.5 * (q[0] - p[0]).abs().sum() > 0.15  # the draft alone would fail this bound


# ---------------------------------------------------------------- trees

from collections import Counter  # noqa: E402

from scipy.stats import chisquare  # noqa: E402

from specdec_core.acceptance import greedy_accept_tree, speculative_accept_tree  # noqa: E402


def test_greedy_tree_follows_the_argmax_through_siblings():
    #            rows: 0=last, node i is row i + 1
    parents = [-1, -1, 1, 1, 0]  # root children 0 and 1; node 1's children 2 and 3; node 0's child 4
    tokens = [7, 5, 6, 9, 8]
    # row 0 picks 5 (node 1), row 2 (node 1) picks 9 (node 3), row 4 (node 3, a leaf) picks 3: bonus
    assert greedy_accept_tree(torch.tensor([5, 0, 9, 0, 3, 0]), tokens, parents) == ([1, 3], 3)
    assert greedy_accept_tree(torch.tensor([7, 8, 0, 0, 0, 4]), tokens, parents) == ([0, 4], 4)
    assert greedy_accept_tree(torch.tensor([2, 8, 9, 0, 0, 4]), tokens, parents) == ([], 2)
    assert greedy_accept_tree(torch.tensor([5, 0, 1, 0, 0, 0]), tokens, parents) == ([1], 1)  # 1 is no child
    assert greedy_accept_tree(torch.tensor([3]), [], []) == ([], 3)


def test_tree_rule_on_a_chain_is_the_chain_rule():
    """The same uniforms, the same decisions: one child per level is speculative_accept."""
    torch.manual_seed(3)
    p = torch.softmax(torch.randn(4, 6) * 2, -1)
    q = torch.softmax(torch.randn(3, 6) * 2, -1)
    for seed in range(200):
        drafts = torch.multinomial(q, 1, generator=torch.Generator().manual_seed(seed)).flatten().tolist()
        n, _ = speculative_accept(p, q, drafts, torch.Generator().manual_seed(seed))
        path, _ = speculative_accept_tree(p, q, drafts, [-1, 0, 1], torch.Generator().manual_seed(seed))
        assert path == list(range(n))  # (the token after differs: the chain rule draws its uniforms at once)


TREE_VOCAB = 6
TREE_TRIALS = 6000
WIDTHS = (3, 2)  # three candidates for the first token, two under each for the second


class PathDistributions:
    """Random distributions that depend on the path only, as a model's do: p for the target, q
    for the drafter (zero outside `draft_vocab`, a reduced draft vocabulary)."""

    def __init__(self, seed: int, draft_vocab: list[int]) -> None:
        self.seed, self.allowed = seed, torch.zeros(TREE_VOCAB, dtype=torch.bool)
        self.allowed[draft_vocab] = True
        self._p: dict[tuple, torch.Tensor] = {}
        self._q: dict[tuple, torch.Tensor] = {}

    def _draw(self, path: tuple, salt: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1000003 + salt + sum((t + 1) * 7 ** i for i, t in enumerate(path)))
        return torch.softmax(torch.randn(TREE_VOCAB, generator=g) * 2, -1)

    def p(self, path: tuple) -> torch.Tensor:
        if path not in self._p:
            self._p[path] = self._draw(path, 0)
        return self._p[path]

    def q(self, path: tuple) -> torch.Tensor:
        if path not in self._q:
            q = self._draw(path, 99991) * self.allowed
            self._q[path] = q / q.sum()
        return self._q[path]


def draw_siblings(q: torch.Tensor, width: int, mode: str, g: torch.Generator) -> list[tuple[int, torch.Tensor]]:
    """(token, the distribution it was drawn from) for `width` siblings: drawn with replacement
    ("iid"), without replacement, or the `width` likeliest tokens ("distinct", one-hot q)."""
    if mode == "distinct":
        return [(int(t), torch.nn.functional.one_hot(t, TREE_VOCAB).float()) for t in q.topk(width).indices]
    siblings, left = [], q.clone()
    for _ in range(width):
        source = left / left.sum()
        token = int(torch.multinomial(source, 1, generator=g))
        siblings.append((token, source))
        if mode == "without":
            left[token] = 0
    return siblings


def sampled_tree(dists: PathDistributions, mode: str, g: torch.Generator):
    """tokens, parents, p [n + 1, V], q [n, V] of a random two-level tree."""
    tokens, parents, q_rows, paths = [], [], [], [()]
    frontier = [(-1, ())]
    for width in WIDTHS:
        next_frontier = []
        for parent, path in frontier:
            for token, q in draw_siblings(dists.q(path), width, mode, g):
                tokens.append(token)
                parents.append(parent)
                q_rows.append(q)
                paths.append(path + (token,))
                next_frontier.append((len(tokens) - 1, path + (token,)))
        frontier = next_frontier
    p = torch.stack([dists.p(path) for path in paths])
    return tokens, parents, p, torch.stack(q_rows)


def tree_p_value(counts: Counter, exact: dict) -> float:
    total = sum(counts.values())
    cells = [(counts.get(k, 0), v * total) for k, v in exact.items()]
    big = [(o, e) for o, e in cells if e >= 5]
    small_o = sum(o for o, e in cells if e < 5) + sum(c for k, c in counts.items() if k not in exact)
    small_e = sum(e for o, e in cells if e < 5)
    observed, expected = [o for o, _ in big], [e for _, e in big]
    if small_e > 0:  # the rare cells, pooled
        observed.append(small_o)
        expected.append(small_e)
    elif small_o:
        return 0.0  # an outcome that can't happen
    scale = sum(observed) / sum(expected)
    return chisquare(observed, [e * scale for e in expected]).pvalue


@pytest.mark.parametrize("mode", ["iid", "without", "distinct"])
@pytest.mark.parametrize("draft_vocab", [list(range(TREE_VOCAB)), [4, 1, 5, 0]], ids=["full-vocab", "4-of-6"])
def test_tree_rule_keeps_the_target_distribution(mode, draft_vocab):
    """The first two tokens of a tree round (a token the round didn't reach drawn as the next
    round would, from p) have exactly the target's joint distribution: chi-square."""
    dists = PathDistributions(seed=len(draft_vocab) + len(mode), draft_vocab=draft_vocab)
    g = torch.Generator().manual_seed(11)
    counts, depths = Counter(), Counter()
    for _ in range(TREE_TRIALS):
        tokens, parents, p, q = sampled_tree(dists, mode, g)
        path, token = speculative_accept_tree(p, q, tokens, parents, g)
        out = [tokens[node] for node in path] + [token]
        depths[len(path)] += 1
        if len(out) < 2:
            out.append(int(torch.multinomial(dists.p((out[0],)), 1, generator=g)))
        counts[tuple(out[:2])] += 1
    exact = {(a, b): float(dists.p(())[a] * dists.p((a,))[b]) for a in range(TREE_VOCAB) for b in range(TREE_VOCAB)}
    assert tree_p_value(counts, exact) > 1e-3
    assert set(depths) == {0, 1, 2}  # all rejected, one level kept, both levels kept: all happen
    # the test has power: the draft's own first-token distribution is told apart
    first = Counter({(a,): sum(c for (x, _), c in counts.items() if x == a) for a in range(TREE_VOCAB)})
    assert tree_p_value(first, {(a,): float(dists.q(())[a]) for a in range(TREE_VOCAB)}) < 1e-6
