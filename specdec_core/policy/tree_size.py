"""The tree-size policy: how many draft nodes a round may verify as a tree (0: a chain).

A bigger tree keeps a longer path more often, but its verify step reads more tokens and the
drafter works longer. So each node budget on a short ladder (0, 4, 8, 16, ... up to what the
target verifies) is judged by what it was measured to give:

    tokens per second(B) = mean tokens per round at B (the accepted path's depth + 1)
                           / (mean drafting seconds per round at B + verify step over the mean
                              nodes drafted at B + 1 tokens, from the measured step costs)

and each drafting round takes the budget with the most, of the chain (budget 0) and the trees
that beat a plain step by MIN_GAIN: a tree that loses to plain decoding is never chosen for
being better than the chain (that chain pays: the draft-length policy drafts only when one does,
or when a tree was measured to, or to probe). A budget not yet tried is tried first (the largest
first: the request's or the runner's bound is what the user asked for), and every REVISIT-th
round the budget tried longest ago is tried again, so a tree that stopped paying shrinks (to a
chain, budget 0) and one that starts to pay grows back. Whether to draft at all is the
draft-length policy's call, which weighs the fastest tree (fastest_tree_rate) with the chain.

Untimed (a seeded generation) or not adaptive: always the largest budget allowed, so the draws
depend on the tokens alone.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .bounds import MIN_GAIN
from .costs import StepCosts

LADDER = (4, 8, 16, 32, 64)  # node budgets tried besides 0 (a chain), within what the target verifies
REVISIT = 16  # rounds between re-tries of the budget measured longest ago
_WINDOW = 32  # rounds remembered per budget: acceptance drifts with the text


@dataclass
class _Measured:
    """The last rounds drafted under one budget: (tokens gained, drafting seconds, nodes drafted)."""

    rounds: deque = field(default_factory=lambda: deque(maxlen=_WINDOW))
    last_tried: int = -1  # the round number it was last chosen at

    def mean(self, index: int) -> float:
        return sum(r[index] for r in self.rounds) / len(self.rounds)


class TreeSizePolicy:
    """Chooses each drafting round's node budget (see the module docstring)."""

    def __init__(self, costs: StepCosts, adaptive: bool = True) -> None:
        self.costs = costs
        self.adaptive = adaptive
        self._measured: dict[int, _Measured] = {}
        self._round = 0
        self.chosen = 0  # the budget of the round under way

    @staticmethod
    def options(allowed: int) -> list[int]:
        """The budgets a round may take: 0 and the ladder's steps under `allowed`, and `allowed`."""
        if allowed <= 1:
            return [0]
        return [0, *(n for n in LADDER if n < allowed), allowed]

    def choose(self, allowed: int) -> int:
        """This drafting round's node budget, at most `allowed` (0: a chain)."""
        self._round += 1
        options = self.options(allowed)
        if not self.adaptive or not self.costs.timed or len(options) == 1:
            self.chosen = options[-1]
            return self.chosen
        untried = [n for n in reversed(options) if not self._get(n).rounds]
        if untried:
            self.chosen = untried[0]
        elif self._round % REVISIT == 0:
            self.chosen = min(options, key=lambda n: self._get(n).last_tried)
        else:
            self.chosen = max((n for n in options if n == 0 or self._pays(n)), key=self.tokens_per_second)
        self._get(self.chosen).last_tried = self._round
        return self.chosen

    def record(self, drafted: int, accepted: int, draft_s: float) -> None:
        """The round drafted under the chosen budget: `drafted` nodes, a path of `accepted` kept."""
        self._get(self.chosen).rounds.append((accepted + 1, draft_s, drafted))

    def tokens_per_second(self, budget: int) -> float:
        """Measured tokens per second of rounds under `budget` (0 until measured)."""
        measured = self._get(budget)
        if not measured.rounds:
            return 0.0
        verify_s = self.costs.target(round(measured.mean(2)) + 1)
        if verify_s is None:
            return 0.0
        return measured.mean(0) / (measured.mean(1) + verify_s)

    def fastest_tree_rate(self, allowed: int) -> float:
        """The measured tokens per second of the fastest tree (budget > 0) within `allowed` that
        beats a plain step by MIN_GAIN (0.0: none does, or none was measured)."""
        return max((self.tokens_per_second(n) for n in self.options(allowed) if n and self._pays(n)), default=0.0)

    def _pays(self, budget: int) -> bool:
        step = self.costs.target(1)
        return step is not None and self.tokens_per_second(budget) * step > MIN_GAIN

    def _get(self, budget: int) -> _Measured:
        return self._measured.setdefault(budget, _Measured())
