"""Candidate trees from per-depth top-k guesses (Medusa's heads, any drafter with ranked options).

A tree draft is tokens with parent indices (-1: the context's last token), in topological order.
Each node is a path of choices (r_1, ..., r_d): the r_1-th guess at depth 1, then the r_2-th at
depth 2, ... Its score is the product of its choices' scores (a guess's probability this round,
or a head's measured accuracy at that rank), as Medusa builds its static trees and EAGLE-2
ranks nodes by cumulative confidence. The tree holds the `budget` best-scoring paths.

Best-first: scores in (0, 1] never rise along a path, so popping paths from a heap in score
order, and pushing a path's first child and next sibling when it is popped, yields the best
paths first, each after its parent: the tree is prefix-closed and its order topological.
"""

from __future__ import annotations

import heapq

Path = tuple[int, ...]  # the ranks chosen at depths 1..d


def best_paths(scores: list[list[float]], budget: int) -> list[Path]:
    """The `budget` best paths through per-depth ranked scores (scores[d][r]: the r-th best
    guess at depth d+1, non-increasing in r), best first; ties go to the shallower path, then
    the lower ranks. Every path's parent comes before it."""
    for depth, row in enumerate(scores):
        if any(not 0 < s <= 1 for s in row):
            raise ValueError(f"scores at depth {depth + 1} must lie in (0, 1], got {row}")
        if any(a < b for a, b in zip(row, row[1:])):
            raise ValueError(f"scores at depth {depth + 1} must be ranked (non-increasing), got {row}")
    paths: list[Path] = []
    heap: list[tuple[float, int, Path]] = []

    def push(path: Path, parent_score: float) -> None:
        depth, rank = len(path) - 1, path[-1]
        if depth < len(scores) and rank < len(scores[depth]):
            score = parent_score * scores[depth][rank]
            heapq.heappush(heap, (-score, len(path), path))

    push((0,), 1.0)
    parent_scores = {(): 1.0}
    while heap and len(paths) < budget:
        negative, _, path = heapq.heappop(heap)
        paths.append(path)
        parent_scores[path] = -negative
        push(path + (0,), -negative)  # first child
        push(path[:-1] + (path[-1] + 1,), parent_scores[path[:-1]])  # next sibling
    return paths


def tree_from_paths(paths: list[Path], guesses: list[list[int]]) -> tuple[list[int], list[int]]:
    """(tokens, parents) of a tree whose nodes are `paths` (parents first) over the per-depth
    ranked guesses: node (r_1..r_d) holds guesses[d-1][r_d]."""
    index: dict[Path, int] = {}
    tokens, parents = [], []
    for path in paths:
        parent = path[:-1]
        if parent and parent not in index:
            raise ValueError(f"path {path} comes before its parent")
        index[path] = len(tokens)
        tokens.append(int(guesses[len(path) - 1][path[-1]]))
        parents.append(index[parent] if parent else -1)
    return tokens, parents


def candidate_tree(guesses: list[list[int]], scores: list[list[float]], budget: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the `budget`-node tree of the most likely combinations of per-depth
    ranked guesses (guesses[d][r] with score scores[d][r]); a chain when every depth has one guess."""
    if len(guesses) != len(scores) or any(len(g) < len(s) for g, s in zip(guesses, scores)):
        raise ValueError("every scored rank needs a guess")
    return tree_from_paths(best_paths(scores, budget), guesses)
