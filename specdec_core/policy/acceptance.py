"""Acceptance of drafted tokens estimated by draft position, from the rounds seen so far (not
to be confused with ../acceptance.py, which decides a round's acceptance)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .costs import SMOOTHING

# The smoothing of a drafter that costs something (a head, a draft model): there the estimate
# decides whether to pause it, and whether a draft is kept is a coin toss. At 0.25 (about the
# last four tries) the offline EAGLE head, kept about 40% of the time, read as 10-20% after a
# few unlucky rounds and sat out the rest of the reply. A free drafter (prompt lookup) is never
# paused, and its estimate must follow copying as it starts and stops (SMOOTHING).
_STEADY_SMOOTHING = 0.1
_PRIOR_TRIES = 2  # see AcceptanceByPosition.rates


@dataclass
class AcceptanceByPosition:
    """Acceptance of drafted tokens by draft position. Position i was tried in a round that
    drafted that far and kept every draft before it, so accepted over tried there is the chance
    that draft i is kept once drafts 1..i-1 were. Counts come from the recent rounds that reached
    the position: they fade each time it is tried (see `add`).

    Drafts kept independently with one probability give one rate at every position, and that
    is what pooling the positions (`estimate`) assumes. A learned drafter's rates differ by
    position, and a copying one's rise along a copied passage. Priced at its pooled rate, the
    offline EAGLE head's rounds of two drafts made its single draft look as poor as its second,
    and the policy paused a head that paid with one draft a round.
    """

    accepted: list[float] = field(default_factory=list)  # by position, 0-based
    tried: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, probability: float, tries: float = 1.0) -> AcceptanceByPosition:
        """One rate for every position, as if seen in `tries` tried first drafts."""
        return cls(accepted=[probability * tries], tried=[tries])

    @property
    def estimate(self) -> float | None:
        """Accepted over tried, all positions pooled (the rate if every position had the same)."""
        tried = sum(self.tried)
        return sum(self.accepted) / tried if tried else None

    def add(self, accepted: int, drafted: int, steady: bool = False) -> None:
        """A round drafted `drafted` tokens and the target kept the first `accepted` of them.
        `steady`: the drafter costs something, so its rates forget slowly (_STEADYSMOOTHING)."""
        keep = 1 - (_STEADY_SMOOTHING if steady else SMOOTHING)
        reached = min(accepted + 1, drafted)  # the kept drafts and the one rejected, if any
        grow = reached - len(self.tried)
        if grow > 0:
            self.accepted.extend([0.0] * grow)
            self.tried.extend([0.0] * grow)
        for i in range(reached):  # a round that stopped short says nothing about later positions
            self.accepted[i] = keep * self.accepted[i] + (i < accepted)
            self.tried[i] = keep * self.tried[i] + 1

    def rates(self, k: int, prior: AcceptanceByPosition | None = None) -> list[float] | None:
        """The acceptance to expect at positions 1..k. Each position's own rate, leaning, as a
        Beta prior of _PRIOR_TRIES pseudo-tries, on the rate before it while it has few tries:
        one lucky round must not read as "always right", and a position never tried is taken to
        be kept as often as the one before it. The first position leans on the prior's first
        (default: this one's pooled estimate). None with nothing to go on."""
        first = prior.rates(1) if prior is not None else None
        lean = first[0] if first else self.estimate
        if lean is None:
            return None
        rates = []
        for i in range(k):
            accepted, tried = (self.accepted[i], self.tried[i]) if i < len(self.tried) else (0.0, 0.0)
            lean = (accepted + _PRIOR_TRIES * lean) / (tried + _PRIOR_TRIES)
            rates.append(lean)
        return rates
