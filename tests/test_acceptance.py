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
