"""Leviathan et al. (arXiv 2211.17192): what speculation should yield, from acceptance and costs;
and its extension to tree drafts (expected tokens from the measured acceptance of each node).

Shared by the engine's draft policy, the benchmark's theory check, the app's live prediction and
the cost model.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
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
    return speedup_of_rounds(expected_tokens(a, g), g, c, v, draft_share)


def speedup_of_rounds(tokens: float, g: float, c: float, v: float, draft_share: float = 1.0) -> float:
    """The speedup of drafting rounds that yield `tokens` on average (the accepted drafts and the
    target's own token) from g drafted tokens each (a tree's: its nodes), a share draft_share of
    the rounds; the others are plain steps (cost 1, one token). Costs as in leviathan_speedup."""
    if not 0.0 <= draft_share <= 1.0:
        raise ValueError(f"need 0 <= draft_share <= 1, got {draft_share}")
    mixed_tokens = draft_share * tokens + (1.0 - draft_share)
    cost = draft_share * (g * c + v) + (1.0 - draft_share)
    return mixed_tokens / cost


# ---------------------------------------------------------------- trees


def rank_paths(parents: Sequence[int]) -> list[tuple[int, ...]]:
    """Each node's sibling ranks along its path from the root: (rank at depth 1, ..., its own
    rank), a rank being a node's place among its parent's children in draft order (the order
    the acceptance rules try siblings in). A chain's node i has (0,) * (i + 1)."""
    paths: list[tuple[int, ...]] = []
    children = [0] * (len(parents) + 1)  # children seen so far, by row
    for parent in parents:
        rank = children[parent + 1]
        children[parent + 1] += 1
        paths.append((*paths[parent], rank) if parent >= 0 else (rank,))
    return paths


def path_probability(ranks: Sequence[int], rates: Mapping[tuple[int, int], float]) -> float:
    """The chance that a node is on the accepted path, its path from the root given as sibling
    ranks (rank_paths), when a node at depth d and rank r is kept with probability
    rates[(d, r)] once its parent was (0 for a place never measured)."""
    probability = 1.0
    for depth, rank in enumerate(ranks, start=1):
        probability *= rates.get((depth, rank), 0.0)
        if probability == 0.0:
            break
    return probability


def expected_tree_tokens(parents: list[int], rates: Mapping[tuple[int, int], float]) -> float:
    """Expected tokens one target forward over a tree draft yields: the target's own token plus,
    for every node, its chance of lying on the accepted path,

        1 + sum over nodes of the product of rates[(depth, rank)] along the node's path.

    The accepted path's length is the number of nodes on it, so by linearity this is exact when
    each node is kept at its (depth, sibling rank) rate once its parent was, whatever happened
    above. A chain (rank 0 everywhere) gives expected_tokens_by_position of its rates by depth;
    siblings add their chances, as at most one of them is kept."""
    return 1.0 + sum(path_probability(ranks, rates) for ranks in rank_paths(parents))
