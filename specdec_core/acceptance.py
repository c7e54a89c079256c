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


# ---------------------------------------------------------------- trees
# A tree draft: node i has token x_i and parent parents[i] (-1: the context's last token); row 0
# of p is the target's distribution after the last token, row i + 1 after node i's path. Each
# rule walks down from the root, one level per accepted token, and returns (the accepted path as
# node indices, the target's token after it).


def children_of(parents: list[int]) -> list[list[int]]:
    """children[r]: the nodes whose parent is row r (row 0 the last token, row i + 1 node i), in
    draft order, the order the rules try siblings in."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        children[parent + 1].append(node)
    return children


def greedy_accept_tree(target_choice: torch.Tensor, draft_tokens: list[int], parents: list[int]) -> tuple[list[int], int]:
    """The longest path whose every token is the target's argmax after its parent, then the
    target's own token: exactly what plain greedy decoding emits (a chain is the one-child case
    of greedy_accept). target_choice: [n + 1] the target's argmax at each row."""
    choices = target_choice.tolist()
    children = children_of(parents)
    path, row = [], 0
    while True:
        match = next((node for node in children[row] if draft_tokens[node] == choices[row]), None)
        if match is None:
            return path, choices[row]
        path.append(match)
        row = match + 1


def speculative_accept_tree(
    p: torch.Tensor, q: torch.Tensor, draft_tokens: list[int], parents: list[int], generator: torch.Generator
) -> tuple[list[int], int]:
    """Recursive rejection sampling over siblings (SpecInfer's multi-step speculative sampling,
    arXiv 2305.09781; without replacement, Jeon et al. arXiv 2402.14160), which keeps exactly
    the target's distribution.

    p: [n + 1, V] the target's distributions by row; q: [n, V], row i the distribution node i
    was drawn from, given its parent and its earlier siblings (one-hot for a deterministic
    drafter). At a row, each child x in turn is accepted with probability min(1, p(x) / q(x));
    on a rejection p becomes the residual norm(max(p - q, 0)) and the next sibling is tried. A
    kept child's row is the next level; when every child is rejected the target draws from what
    is left of p (after a one-hot sibling that is p with that token zeroed), and at a leaf it
    draws a bonus token from p. Why it is exact: given the siblings tried so far, the residual
    is what the output must still add up to, whatever the rejected token was.
    """
    children = children_of(parents)
    path, row = [], 0
    while True:
        target = p[row]
        for node in children[row]:
            x = draft_tokens[node]
            r = torch.rand((), generator=generator, device=p.device)
            if r * q[node, x] < target[x]:  # r < p/q without the division, as the chain rule
                path.append(node)
                row = node + 1
                break
            target = residual_distribution(target, q[node])
        else:
            return path, sample(target, generator)
