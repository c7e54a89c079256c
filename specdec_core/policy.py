"""How many tokens to draft next round, and whether drafting pays at all.

Two layers:
- the draft length k follows acceptance: a round with at least `raise_at` of its drafts
  accepted raises k by one, one under `lower_below` lowers it by one, within [lowest, highest];
- measured costs decide whether a round should draft: with the acceptance seen so far and the
  measured draft and verify times, a round of k' <= k drafts must promise more tokens per second
  than a plain decoding step. If none does, the engine decodes plainly and probes again later,
  backing off while speculation keeps not paying (at once to the longest pause when even a
  perfect draft could not pay). A drafter whose proposals cost next to nothing (prompt lookup)
  is never paused: each plain round still asks it, and whether its first token matched the
  target's keeps the acceptance estimate current, so drafting resumes as soon as copying does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .theory import expected_tokens

DEFAULT_DRAFT_LENGTH = 5
MIN_DRAFT_LENGTH = 2
MAX_DRAFT_LENGTH = 8

_SMOOTHING = 0.25  # weight of the newest sample in the running averages
_MAX_BACKOFF = 32  # at most this many plain rounds between probes of a draft that may pay
_HOPELESS_BACKOFF = 128  # ... and of one that could not pay even if always right
_CHEAP = 0.05  # a drafter costing under this share of a target step per token is "free"


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - _SMOOTHING) * old + _SMOOTHING * new


@dataclass
class StepCosts:
    """Running averages of measured times: target forwards by token count, drafting per token."""

    target_s: dict[int, float] = field(default_factory=dict)  # tokens in the forward -> seconds
    draft_s_per_token: float | None = None

    def record_target(self, tokens: int, seconds: float) -> None:
        self.target_s[tokens] = _average(self.target_s.get(tokens), seconds)

    def record_draft(self, tokens: int, seconds: float) -> None:
        if tokens:
            self.draft_s_per_token = _average(self.draft_s_per_token, seconds / tokens)

    def target(self, tokens: int) -> float | None:
        """Time of a target forward over `tokens` tokens: measured, else a line through the others."""
        if tokens in self.target_s:
            return self.target_s[tokens]
        if len(self.target_s) < 2:
            return None
        sizes = sorted(self.target_s)
        lo, hi = sizes[0], sizes[-1]
        slope = max((self.target_s[hi] - self.target_s[lo]) / (hi - lo), 0.0)
        return max(self.target_s[lo] + slope * (tokens - lo), 0.0)


@dataclass
class DraftLengthPolicy:
    """Adaptive k (see the module docstring). Not adaptive: k is fixed and every round drafts."""

    k: int = DEFAULT_DRAFT_LENGTH
    adaptive: bool = True
    lowest: int = MIN_DRAFT_LENGTH
    highest: int = MAX_DRAFT_LENGTH
    raise_at: float = 0.8
    lower_below: float = 0.4
    costs: StepCosts = field(default_factory=StepCosts)
    acceptance: float | None = None  # running per-token acceptance estimate
    _plain_rounds_left: int = 0
    _backoff: int = 1
    _probe_due: bool = False

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"draft_length must be >= 1, got {self.k}")
        # A k the caller asks for explicitly is always reachable.
        self.lowest, self.highest = min(self.lowest, self.k), max(self.highest, self.k)

    def next_draft_length(self, room: int) -> int:
        """Drafts to ask for this round (0: a plain step); `room` caps it (max_new_tokens)."""
        if room <= 0:
            return 0
        if not self.adaptive:
            return min(self.k, room)
        if self.costs.target(1) is None:
            return 0  # calibrate: one plain step measures what speculation must beat
        if self._plain_rounds_left > 0:
            self._plain_rounds_left -= 1
            return 0
        if self._probe_due:  # after a pause, really draft once: the acceptance may have changed
            self._probe_due = False
            return min(self.k, room)
        # A free drafter's length is the cost model's choice over the whole range (verify cost
        # is what matters, and it need not grow with length); a costly one stays within k.
        free = self.drafting_is_free()
        best = self._best_paying_length(min(self.highest if free else self.k, room))
        if best == 0 and not free:
            # Not paying now: decode plainly for a while, then probe again.
            self._plain_rounds_left, self._probe_due = self._backoff, True
            hopeless = not self._pays(1.0, min(self.k, room))
            self._backoff = _HOPELESS_BACKOFF if hopeless else min(self._backoff * 2, _MAX_BACKOFF)
        return best

    def drafting_is_free(self) -> bool:
        """Whether proposals cost next to nothing next to a target step (e.g. prompt lookup)."""
        step, per_token = self.costs.target(1), self.costs.draft_s_per_token
        return step is not None and per_token is not None and per_token < _CHEAP * step

    def observe_unverified(self, first_draft_matched: bool) -> None:
        """A free drafter's proposal was not verified; its first token did (not) match the target's."""
        if self.adaptive:
            self.acceptance = _average(self.acceptance, float(first_draft_matched))

    def update(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """Learn from one round: its acceptance and its measured costs."""
        self.costs.record_target(drafted + 1, verify_s)
        self.costs.record_draft(drafted, draft_s)
        if not self.adaptive or drafted == 0:
            return
        rate = accepted / drafted
        self.acceptance = _average(self.acceptance, rate)
        if rate >= self.raise_at:
            self.k = min(self.k + 1, self.highest)
        elif rate < self.lower_below:
            self.k = max(self.k - 1, self.lowest)

    def _pays(self, acceptance: float, k_max: int) -> bool:
        """Whether some k' <= k_max drafts at this acceptance beat a plain step, by measured costs."""
        return self._best_length(acceptance, k_max) > 0

    def _best_paying_length(self, k_max: int) -> int:
        """The best draft length at the current acceptance estimate (0: plain decoding pays more)."""
        if self.acceptance is None or self.costs.draft_s_per_token is None:
            return k_max  # nothing measured yet: try speculation
        best = self._best_length(self.acceptance, k_max)
        if best:
            self._backoff = 1
        return best

    def _best_length(self, acceptance: float, k_max: int) -> int:
        """The k' in [lowest, k_max] with the most expected tokens per second, if that beats a plain
        step; 0 if none does; k_max if some length was never measured (try it)."""
        best, best_rate = 0, 1.0 / self.costs.target(1)
        for k in range(min(self.lowest, k_max), k_max + 1):
            verify = self.costs.target(k + 1)
            if verify is None:
                return k_max
            rate = expected_tokens(acceptance, k) / (k * self.costs.draft_s_per_token + verify)
            if rate > best_rate:
                best, best_rate = k, rate
        return best
