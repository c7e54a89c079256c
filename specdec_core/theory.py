"""Leviathan et al. (arXiv 2211.17192): what speculation should yield, from acceptance and costs.

Shared by the engine's draft policy, the benchmark's theory check and the cost model.
"""

from __future__ import annotations

import operator
from itertools import accumulate


def expected_tokens(a: float, g: float) -> float:
    """Expected tokens one target forward yields: (1 - a^(g+1)) / (1 - a).

    a: probability that a drafted token is accepted (independently at each position);
    g: draft length. The accepted drafts plus the target's own token (Leviathan et al.,
    arXiv 2211.17192, eq. 1). Equals g + 1 at a = 1 and 1 at a = 0.
    """
    if not 0.0 <= a <= 1.0 or g < 0:
        raise ValueError(f"need 0 <= a <= 1 and g >= 0, got a={a}, g={g}")
    if a == 1.0:
        return g + 1.0
    return (1.0 - a ** (g + 1.0)) / (1.0 - a)


def expected_tokens_by_position(rates: list[float]) -> float:
    """Expected tokens one target forward yields when draft i is kept with probability rates[i-1]
    once drafts 1..i-1 were: 1 + r1 + r1 r2 + ... + r1 ... rg (g = len(rates)). With one rate a
    at every position it is expected_tokens(a, g)."""
    return expected_tokens_by_length(rates)[-1]


def expected_tokens_by_length(rates: list[float]) -> list[float]:
    """expected_tokens_by_position(rates[:g]) for every g in 0..len(rates), in one pass."""
    return list(accumulate(accumulate(rates, operator.mul), initial=1.0))


def leviathan_speedup(a: float, g: float, c: float, v: float = 1.0) -> float:
    """Predicted speedup over plain decoding: (1 - a^(g+1)) / ((1 - a) (g c + v)).

    a: acceptance probability per drafted token; g: draft length; c: cost of one draft step
    relative to one target 1-token step; v: cost of the target's verify step over 1 + g tokens
    relative to a 1-token step. Leviathan et al. (arXiv 2211.17192, Theorem 3.8) take v = 1;
    on a CPU a verify step costs more than a 1-token step, so it is measured.

    Example: a = 0.8, g = 4, c = 0.1, v = 1.2 gives 3.3616 / 1.6 = 2.101.
    """
    if c < 0 or v <= 0:
        raise ValueError(f"need c >= 0 and v > 0, got c={c}, v={v}")
    return expected_tokens(a, g) / (g * c + v)


def predicted_speedup(a: float, g: float, c: float, v: float, draft_share: float = 1.0) -> float:
    """Leviathan's speedup when only a share of the rounds drafts (the others are plain steps).

    Per round: with probability draft_share the round drafts g tokens (cost g c + v, yields
    expected_tokens(a, g) tokens), else it is a plain step (cost 1, yields 1 token).
    draft_share = 1 gives leviathan_speedup(a, g, c, v).
    """
    if not 0.0 <= draft_share <= 1.0:
        raise ValueError(f"need 0 <= draft_share <= 1, got {draft_share}")
    tokens = draft_share * expected_tokens(a, g) + (1.0 - draft_share)
    cost = draft_share * (g * c + v) + (1.0 - draft_share)
    return tokens / cost
