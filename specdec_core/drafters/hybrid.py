"""The hybrid drafter: prompt lookup while the reply copies from the context, a learned drafter
(an EAGLE head or a draft model) otherwise.

Each round it asks prompt lookup first (it costs next to nothing). With no match the other
drafter proposes. With a match, the two are weighed by what they have shown so far: each one's
acceptance and drafting time per token, and the target's measured verify cost for the length
each would draft (best_length: a source's best length and its expected tokens per second). Each source drafts its own best length. Both keep their state current either way: the
learned drafter reads the target's features (or catches up on the tokens) whichever source
drafted.

A learned drafter whose expected tokens per second, measured so far, don't beat a plain step
sits out (the round decodes plainly, or drafts from lookup), except for one probe every
PROBE_EVERY rounds it sat out.

The hybrid gates itself, so the engine asks it every round (Drafter.chooses_length). Gated by
the engine, from one acceptance and one drafting cost pooled over both sources, a few misses of
the head made the hybrid look dear and poor, the engine stopped drafting, and since nothing then
updated those estimates, lookup's matches went unused until a probe (measured on the 4-bit
target: 4 of 5 Spec-Bench conversation questions decoded plainly).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..drafter import NO_DRAFT, Draft, Drafter
from ..policy import AcceptanceByPosition, StepCosts
from ..policy.costs import average
from ..sampling import SamplingParams
from ..theory import expected_tokens_by_position
from .lookup import PromptLookupDrafter


PROBE_EVERY = 16  # rounds a learned drafter that doesn't pay sits out between two probes


class HybridDrafter(Drafter):
    """Prompt lookup or `learned` (EagleDrafter or ModelDrafter), chosen each round."""

    name = "hybrid"
    chooses_length = True

    def __init__(self, learned: Drafter, lookup: PromptLookupDrafter | None = None) -> None:
        self.learned = learned
        self.lookup = lookup or PromptLookupDrafter()
        self.feature_layers = learned.feature_layers
        self.sources = {"lookup": DraftSource("lookup"), learned.name: DraftSource(learned.name, steady=True)}
        self._costs = StepCosts()
        self._last: tuple[str, int, float] | None = None  # (source, drafted, seconds) of the last proposal
        self.chosen = {name: 0 for name in self.sources}  # proposals per source (for reports)
        self._sat_out = 0  # rounds the learned drafter sat out since it last proposed

    def bind(self, target_model, tokenizer) -> None:
        self.learned.bind(target_model, tokenizer)
        self.lookup.bind(target_model, tokenizer)

    def use_costs(self, costs: StepCosts) -> None:
        self._costs = costs
        self.learned.use_costs(costs)

    def reset(self, prompt_ids: list[int]) -> None:
        self.learned.reset(prompt_ids)
        self._last = None

    def features_from(self) -> int | None:
        return self.learned.features_from()

    def observe(self, features: torch.Tensor, position: int) -> None:
        self.learned.observe(features, position)

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        started = time.perf_counter()
        copied = self.lookup.propose(context, k, params, generator)
        lookup_s = time.perf_counter() - started
        # The learned drafter's own best length within the engine's cap k: a head right a third
        # of the time pays (if at all) with one draft, not five.
        length, rate = best_length(self.sources[self.learned.name], k, self._costs)
        if copied.tokens:  # only as far as pays at lookup's acceptance: a longer verify costs more
            copied_length, copied_rate = best_length(self.sources["lookup"], len(copied.tokens), self._costs)
            copied = _first(copied, copied_length)
            if rate is None or copied_rate >= rate:  # unmeasured (both are, or neither), or it pays more
                return self._from_lookup(copied, lookup_s)
        if not self._learned_may_draft(rate):
            return self._from_lookup(copied, lookup_s) if copied.tokens else self._nothing()
        if self.learned.lag(context):  # what it missed while sitting out; not drafting time
            self.learned.catch_up(context)
        started = time.perf_counter()
        draft = self.learned.propose(context, length, params, generator)
        self._last = (self.learned.name, len(draft.tokens), time.perf_counter() - started)
        self.chosen[self.learned.name] += 1
        return draft

    def _from_lookup(self, copied: Draft, seconds: float) -> Draft:
        self._last = ("lookup", len(copied.tokens), seconds)
        self.chosen["lookup"] += 1
        return copied

    def _nothing(self) -> Draft:
        self._last = None
        return NO_DRAFT

    def _learned_may_draft(self, rate: float | None) -> bool:
        """Whether the learned drafter proposes this round, given its expected tokens per second
        at its best length: unmeasured, paying, or due a probe."""
        step = self._costs.target(1)
        if rate is None or step is None or rate * step >= 1.0 or self._sat_out >= PROBE_EVERY:
            self._sat_out = 0
            return True
        self._sat_out += 1
        return False

    def unverified(self) -> None:
        self._last = None

    def accepted(self, n: int) -> None:
        if self._last is None:
            return
        source, drafted, seconds = self._last
        self.sources[source].record(drafted, n, seconds)
        if source == self.learned.name:
            self.learned.accepted(n)
        self._last = None

    def release(self, context: list[int] | None) -> None:
        self.learned.release(context)


def _first(draft: Draft, n: int) -> Draft:
    """The draft's first n tokens (and their distributions)."""
    if n >= len(draft.tokens):
        return draft
    return Draft(draft.tokens[:n], None if draft.probs is None else draft.probs[:n])


# ---------------------------------------------------------------- choosing between the sources


@dataclass
class DraftSource:
    """One drafter a hybrid can ask this round: its measured acceptance and drafting cost."""

    name: str
    acceptance: AcceptanceByPosition = field(default_factory=AcceptanceByPosition)
    draft_s_per_token: float | None = None
    steady: bool = False  # a learned drafter: its acceptance forgets slowly (AcceptanceByPosition.add)

    def record(self, drafted: int, accepted: int, seconds: float) -> None:
        """Learn from a verified proposal of this source."""
        if drafted:
            self.acceptance.add(accepted, drafted, steady=self.steady)
            self.draft_s_per_token = average(self.draft_s_per_token, seconds / drafted)


_UNMEASURED_ACCEPTANCE = 0.5  # what a source that never drafted is assumed to reach


def tokens_per_second(source: DraftSource, k: int, costs: StepCosts) -> float | None:
    """Expected new tokens per second of a round that drafts k tokens from `source` (None until
    the target's steps are measured)."""
    verify = costs.target(k + 1)
    if verify is None or k <= 0:
        return None
    rates = source.acceptance.rates(k) or [_UNMEASURED_ACCEPTANCE] * k
    round_s = verify + k * (source.draft_s_per_token or 0.0)
    return expected_tokens_by_position(rates) / round_s if round_s > 0 else None


def best_length(source: DraftSource, k_max: int, costs: StepCosts) -> tuple[int, float | None]:
    """The draft length in [1, k_max] with the most expected tokens per second from `source`, and
    that rate; (k_max, None) until the target's steps are measured."""
    rates = {k: tokens_per_second(source, k, costs) for k in range(1, k_max + 1)}
    if not rates or None in rates.values():
        return k_max, None
    best = max(rates, key=rates.get)
    return best, rates[best]
