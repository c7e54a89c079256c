"""Tree drafts as a decode path sees them: which rows of one verify step attend to which.

A verify step over a tree reads [last, d1..dn]: row 0 is the context's last token, row i + 1 is
draft node i, whose parent is `parents[i]` (-1: the last token, row 0). Nodes come in
topological order (a parent before its children). Each row attends to the whole cached prefix
and to its own ancestors and itself, never to a sibling's branch, and sits at the position its
depth gives: so every row scores exactly what it would score at the end of its own path read as
a chain.
"""

from __future__ import annotations

import torch

# forward_tree also hands the tree's parents to the attention function under this keyword
# (transformers passes unknown keywords down to it): row-exact attention reads them, as it
# computes each row alone and applies no mask; the stock ones ignore it and apply the 4D mask.
TREE_KWARG = "tree_parents"


def check_parents(parents: list[int]) -> None:
    """ValueError unless `parents` is a tree in topological order (each parent is -1 or an
    earlier node)."""
    for node, parent in enumerate(parents):
        if not -1 <= parent < node:
            raise ValueError(f"tree node {node} has parent {parent}: a parent must be -1 (the context's "
                             "last token) or an earlier node")


def row_parents(parents: list[int]) -> list[int]:
    """The parent row of each row of the verify step (row 0, the last token, has none: -1)."""
    return [-1, *(parent + 1 for parent in parents)]


def row_depths(parents: list[int]) -> list[int]:
    """Each row's distance from row 0 (the last token's is 0, a root draft's 1)."""
    depths = [0]
    for parent in parents:
        depths.append(depths[parent + 1] + 1)
    return depths


def attended_rows(parents: list[int]) -> list[list[int]]:
    """For each row, the rows of the step it attends to: its ancestors and itself, in order
    (the order its path would have been read in as a chain)."""
    rows: list[list[int]] = []
    for parent in row_parents(parents):
        rows.append([*(rows[parent] if parent >= 0 else []), len(rows)])
    return rows


def ancestry(parents: list[int]) -> torch.Tensor:
    """[n + 1, n + 1] bool: row r may attend to row c (c is r or one of its ancestors)."""
    size = len(parents) + 1
    sees = torch.eye(size, dtype=torch.bool)
    for row, parent in enumerate(row_parents(parents)):
        if parent >= 0:
            sees[row] |= sees[parent]  # topological order: the parent's row is complete
    return sees


def tree_attention_mask(parents: list[int], cached: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The additive 4D mask [1, 1, n + 1, cached + n + 1] of a verify step over a tree after
    `cached` tokens: 0 where a row attends, the dtype's lowest value where it does not.
    Additive rather than boolean because transformers' eager attention adds the mask it is
    given, while sdpa takes either (a 4D mask reaches both unchanged, masking_utils)."""
    sees = torch.cat([torch.ones(len(parents) + 1, cached, dtype=torch.bool), ancestry(parents)], dim=1)
    mask = torch.zeros(sees.shape, dtype=dtype).masked_fill_(~sees, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def is_chain_prefix(rows: list[int]) -> bool:
    """Whether the rows kept are the step's first ones in order (a chain's accepted prefix):
    then rolling back is a crop, and nothing has to move."""
    return rows == list(range(len(rows)))


def path_tensors(parents: list[int], device=None) -> tuple[torch.Tensor, ...]:
    """Each draft row's path (its ancestors' rows and its own, in path order) as a tensor: how a
    compiled tree step takes the tree (row_attention reads them under TREE_KWARG). Row 0's is
    left out: it is always [0]."""
    return tuple(torch.tensor(rows, device=device) for rows in attended_rows(parents)[1:])


def padded_tree(parents: list[int], nodes: int) -> list[int]:
    """`parents` grown to `nodes` nodes by leaves under the last token (-1), appended: rows that
    no real row attends to, so a tree step compiled for `nodes` nodes verifies a smaller tree."""
    return parents + [-1] * (nodes - len(parents))
