"""Speculative accept/reject as pure tensor functions, in the notation of the papers.

p: target distributions, q: draft distributions, x: draft tokens. No models here, so every
rule can be tested with hand-written distributions.
"""

from __future__ import annotations

import torch

from .sampling import sample


def greedy_accept(target_choice: torch.Tensor, draft_tokens: list[int]) -> tuple[int, int]:
    """Accept drafts while they equal the target's argmax; then emit the target's own token.

    target_choice: [k+1] argmax token of the target at each draft position plus the bonus one.
    Returns (n accepted, the target's token after them): a correction at the first mismatch,
    or the bonus token when all k drafts match.
    """
    choices = target_choice.tolist()
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == choices[n]:
        n += 1
    return n, choices[n]


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over [V]; where that has no mass (p <= q everywhere), p itself.

    The zero-mass case only happens when p == q, where rejection has probability 0 anyway;
    falling back to p keeps the function total for floating-point edge cases.
    """
    residual = (p - q).clamp_min(0)
    mass = residual.sum()
    return residual / mass if mass > 0 else p


def speculative_accept(
    p: torch.Tensor, q: torch.Tensor, draft_tokens: list[int], generator: torch.Generator
) -> tuple[int, int]:
    """Speculative sampling: Leviathan et al., arXiv 2211.17192, Algorithm 1 (Chen et al. 2302.01318).

    p: [k+1, V] target distributions (row i is the target's distribution for position i);
    q: [k, V] draft distributions the draft tokens were drawn from; draft_tokens: k ids.
    Draft token x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)). At the first
    rejection the target draws from the residual norm(max(0, p_i - q_i)); if all k are accepted
    it draws a bonus token from p_k. The output then has exactly the distribution p.
    Returns (n accepted, the target's token).
    """
    k = len(draft_tokens)
    if k:
        x = torch.tensor(draft_tokens, device=p.device)
        rows = torch.arange(k, device=p.device)
        p_x, q_x = p[rows, x], q[rows, x]
        r = torch.rand(k, generator=generator, device=p.device)
        # r < p/q written without the division: q_x > 0 for tokens that were actually drawn.
        rejected = (r * q_x >= p_x).tolist()
        n = rejected.index(True) if True in rejected else k
    else:
        n = 0
    if n < k:
        return n, sample(residual_distribution(p[n], q[n]), generator)
    return n, sample(p[k], generator)
