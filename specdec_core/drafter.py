"""The drafter interface: what the engine asks of every drafter, and the Draft it gets back.

Drafters propose tokens for the target to verify. A new drafting method is one new class
(one module in this folder).

The engine drives a drafter through these calls per generation:
    reset(prompt_ids)                       a new sequence starts
    lag(context) / catch_up(context)        how many tokens it has yet to read before it can
                                             propose (a new prompt, rounds it sat out), and
                                             reading them; timed apart from drafting
    propose(context, k, params, generator)  -> Draft: up to k tokens + the distributions
                                             they were drawn from
    propose_tree(context, k, nodes, ...)    what the engine calls: a Draft that may be a tree of
                                             up to `nodes` tokens, k deep at most (nodes 0: a
                                             chain); by default propose()'s chain
    accepted(n)                             the target kept the first n drafted tokens
    accepted_path(nodes)                    the target kept these draft nodes (a path from the
                                             root, in order); by default accepted(len(nodes)),
                                             which is exact for a chain
    unverified()                            a plain round's proposal, only compared (free drafters)
    release(context)                        the generation ended with this sequence (None:
                                             drop whatever the drafter kept from it)

A drafter that reads the target's own features (an EAGLE head) names the target layers in
`feature_layers`; the engine then captures their inputs during the target forwards it runs
anyway and hands them over with observe(features, position) after the prompt prefill and after
every verify (only the rows that stand after acceptance). features_from() tells the engine,
right after reset(), the first position whose features the drafter lacks, so the prefill reads
from there (a drafter that kept less of the last turn than the target did).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .decoding.tree import row_depths
from .policy import StepCosts
from .sampling import SamplingParams


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    # [len(tokens), V_target] distributions the tokens were drawn from, or None when the
    # drafter is deterministic (each q is then one-hot at its token) or decoding is greedy.
    probs: torch.Tensor | None = None
    # A tree: the parent of each token, an index into `tokens` or -1 for the context's last
    # token; parents come before their children. Each probs row is then the distribution its
    # token was drawn from given its path and its earlier siblings. None: a chain (the parent
    # of each token is the one before it), what every drafter proposed before trees.
    parents: list[int] | None = None

    @property
    def depth(self) -> int:
        """The longest path's tokens: what a round may accept at most."""
        if self.parents is None:
            return len(self.tokens)
        return max(row_depths(self.parents))

    def first_ranked_line(self, path: list[int]) -> tuple[int, int]:
        """The draft's first-ranked line (the root's first child, that node's first child, and
        so on: the chain a chain round would have drafted, children being in the order the
        acceptance rules try them) as (its length, how many of its tokens the accepted `path`
        kept). A chain is its own line."""
        if self.parents is None:
            return len(self.tokens), len(path)
        first_child: dict[int, int] = {}
        for node, parent in enumerate(self.parents):
            first_child.setdefault(parent, node)
        line, node = [], first_child.get(-1)
        while node is not None:
            line.append(node)
            node = first_child.get(node)
        kept = 0
        while kept < min(len(line), len(path)) and line[kept] == path[kept]:
            kept += 1
        return len(line), kept

    def is_leaf(self, node: int) -> bool:
        """Whether no token of the draft follows `node` (-1: the last token, a leaf of an empty draft)."""
        if self.parents is None:
            return node == len(self.tokens) - 1
        return node not in self.parents


NO_DRAFT = Draft(tokens=[])


class Drafter:
    """Base class: a drafter that proposes nothing. Subclasses override `propose`."""

    name = "none"
    feature_layers: tuple[int, ...] = ()  # target layers whose inputs this drafter reads
    # True: the drafter weighs its own options each round from the costs use_costs hands it,
    # drafts nothing when nothing pays, and reads what it missed itself (lag stays 0); the
    # engine then asks it every round for up to the longest draft (policy.drafter_chooses).
    chooses_length = False

    def bind(self, target_model, tokenizer) -> None:
        """Called once by the engine: check that this drafter can serve that target."""

    def use_costs(self, costs: StepCosts) -> None:
        """Called by the engine as each generation starts: the target step costs its policy
        measures (live), for a drafter that weighs its options by them (the hybrid). A seeded
        generation hands over costs that stay unmeasured (StepCosts.timed False), so choices
        made from them depend on the tokens alone."""

    def reset(self, prompt_ids: list[int]) -> None:
        """A new sequence starts with these prompt tokens."""

    def features_from(self) -> int | None:
        """After reset(): the first sequence position whose target features this drafter still
        needs (None: it reads no features, or lacks none the engine's cache would skip)."""
        return None

    def observe(self, features: torch.Tensor, position: int) -> None:
        """[n, F] target features of the sequence positions position .. position + n - 1."""

    def lag(self, context: list[int]) -> int:
        """Tokens of the context this drafter must read (catch up on) before proposing."""
        return 0

    def catch_up(self, context: list[int]) -> None:
        """Read those tokens now."""

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        return NO_DRAFT

    def propose_tree(
        self, context: list[int], k: int, nodes: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        """A draft that may be a tree (Draft.parents) of at most `nodes` tokens and k deep;
        nodes 0: the target verifies chains only now. A chain drafter keeps the default: its
        chain of up to k tokens."""
        return self.propose(context, k, params, generator)

    def accepted(self, n: int) -> None:
        """The target accepted the first n tokens of the last draft (told only of a draft that had tokens)."""

    def accepted_path(self, nodes: list[int]) -> None:
        """The target accepted these nodes of the last draft, the path from its root in order
        (told only of a draft that had tokens). A tree drafter that keeps state per node (a
        cache) keeps the path's and drops the rest; for a chain the path is its first
        len(nodes) tokens, hence the default."""
        self.accepted(len(nodes))

    def unverified(self) -> None:
        """The last proposal was only compared with the target's token, never verified (a free
        drafter asked during a plain round): it says nothing of acceptance."""

    def release(self, context: list[int] | None) -> None:
        """The generation is over, ending with `context`. A drafter may keep what it read of it
        for the next generation; with None it must drop that."""
