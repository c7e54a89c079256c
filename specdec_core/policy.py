"""How many tokens to draft next round, and whether drafting pays at all.

Two layers:
- the draft length k follows acceptance: a round with at least `raise_at` of its drafts
  accepted raises k by one, one under `lower_below` lowers it by one, within [lowest, highest];
- measured costs decide whether a round should draft: with the acceptance seen so far (by draft
  position, and estimated apart within streaks of fully kept drafts and after misses, as copying
  comes in streaks) and the measured draft and verify times, a round of k' <= k drafts must
  promise 5% more tokens per second than a plain decoding step, and the tokens left must repay the
  drafter's catch-up (reading a new prompt, or what it missed while paused). If no length pays,
  the engine decodes plainly. It probes again (drafts once, at the length that would pay most,
  to re-measure) when the time saved for exploration covers what the probe is expected to lose:
  each plain round puts a fixed share of its time aside, so probing a draft that doesn't pay
  never costs more than that share, however dear its catch-up.
  A drafter whose proposals cost next to nothing (prompt lookup) is never paused: each plain
  round still asks it, and whether its first token matched the target's keeps the acceptance
  estimate current, so drafting resumes as soon as copying does.

An untimed policy (timed=False, what a seeded generation uses) keeps only the first layer: every
round drafts k, and k follows acceptance alone, so the same tokens give the same lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .decoding.base import MAX_STEP_TOKENS
from .theory import expected_tokens_by_length, expected_tokens_by_position

# The draft lengths anyone may ask for: the engine, the app's slider, models.yaml and the API all
# read these bounds; a verify step (the last token and its drafts) is one step of a decode path.
# (Adaptive drafting moves k within MIN/MAX_DRAFT_LENGTH, or up to the k asked.)
DRAFT_LENGTH_BOUNDS = (1, MAX_STEP_TOKENS - 1)
DEFAULT_DRAFT_LENGTH = 5
MIN_DRAFT_LENGTH = 2
MAX_DRAFT_LENGTH = 8

_SMOOTHING = 0.25  # weight of the newest sample in the running averages
# The same for the acceptance of a drafter that costs something (a head, a draft model): there
# the estimate decides whether to pause it, and whether a draft is kept is a coin toss. At 0.25
# (about the last four tries) the offline EAGLE head, kept about 40% of the time, read as 10-20%
# after a few unlucky rounds and sat out the rest of the reply. A free drafter (prompt lookup) is
# never paused, and its estimate must follow copying as it starts and stops.
_STEADY_SMOOTHING = 0.1
_EXPLORATION_SHARE = 0.02  # of plain decoding time, what probes of a non-paying draft may lose
_CHEAP = 0.05  # a drafter costing under this share of a target step per token is "free"
_PRIOR_TRIES = 2  # see Acceptance.rates
# Drafting must promise at least this speedup over a plain step: the estimates are noisy, and a
# marginal gain predicted from them is as likely a loss.
_MIN_GAIN = 1.05


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - _SMOOTHING) * old + _SMOOTHING * new


@dataclass
class LineFit:
    """seconds = fixed + per_token * tokens, fitted by least squares to recent samples (each
    older sample's weight fading by _SMOOTHING per new one).

    A drafter reads the tokens it missed in one batched pass: a fixed cost (the pass) and a small
    one per token. A rate per token alone misprices both ends (the offline EAGLE head: 659 tokens
    priced at 187 ms took 38, one token priced at 0.2 ms took 1.8), and overpriced catch-ups kept a
    paused head from ever being probed again. Until samples of two sizes are in, seconds are taken
    as proportional to tokens."""

    weight: float = 0.0  # the samples' weights and their weighted sums
    tokens: float = 0.0
    seconds: float = 0.0
    tokens_squared: float = 0.0
    tokens_seconds: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        keep = 1 - _SMOOTHING
        self.weight = keep * self.weight + 1
        self.tokens = keep * self.tokens + tokens
        self.seconds = keep * self.seconds + seconds
        self.tokens_squared = keep * self.tokens_squared + tokens * tokens
        self.tokens_seconds = keep * self.tokens_seconds + tokens * seconds

    def at(self, tokens: int) -> float | None:
        """The fitted seconds for `tokens` (None before any sample)."""
        if not self.weight:
            return None
        mean_tokens, mean_seconds = self.tokens / self.weight, self.seconds / self.weight
        spread = self.tokens_squared / self.weight - mean_tokens**2
        if spread <= (0.01 * mean_tokens) ** 2:  # one size seen: no slope to fit
            return tokens * mean_seconds / mean_tokens
        per_token = max((self.tokens_seconds / self.weight - mean_tokens * mean_seconds) / spread, 0.0)
        fixed = max(mean_seconds - per_token * mean_tokens, 0.0)
        return fixed + per_token * tokens


@dataclass
class StepCosts:
    """Running averages of measured times: target forwards by token count, drafting per token,
    and the drafter's catch-up by tokens read (a line: one pass plus a cost per token).

    A forward over n > 1 tokens is remembered relative to the 1-token step of its time, and
    priced at that ratio times the current 1-token step. Plain steps come every few rounds and
    follow the context as it grows; a verify size may not have run since the context was much
    shorter (an engine keeps its costs across replies), and its seconds from then would make
    drafting look cheap on a long prompt: 12.6 ms remembered against 17.2 ms measured there.
    """

    target_s: dict[int, float] = field(default_factory=dict)  # tokens in the forward -> seconds
    draft_s_per_token: float | None = None
    catch_up_seconds: LineFit = field(default_factory=LineFit)  # tokens read -> seconds
    timed: bool = True  # False: records nothing, so every choice made from these stays untimed
    # tokens (> 1) -> the forward's time over the 1-token step's average when it ran
    relative: dict[int, float] = field(default_factory=dict)

    def record_target(self, tokens: int, seconds: float) -> None:
        if not self.timed:
            return
        self.target_s[tokens] = _average(self.target_s.get(tokens), seconds)
        step = self.target_s.get(1)
        if tokens > 1 and step:
            self.relative[tokens] = _average(self.relative.get(tokens), seconds / step)

    def record_draft(self, tokens: int, seconds: float) -> None:
        if tokens and self.timed:
            self.draft_s_per_token = _average(self.draft_s_per_token, seconds / tokens)

    def record_catch_up(self, tokens: int, seconds: float) -> None:
        if tokens and self.timed:
            self.catch_up_seconds.add(tokens, seconds)

    def drafting_measured(self) -> bool:
        """Whether a drafting round was timed, so every round length can be priced."""
        return self.draft_s_per_token is not None and len(self.target_s) >= 2

    def target(self, tokens: int) -> float | None:
        """Time of a target forward over `tokens` tokens: measured, else that of the largest
        measured forward below it (None until two sizes are measured).

        A forward never gets cheaper with more tokens, so this is a lower bound: an unmeasured
        length looks at least as good as it can be, is tried wherever it might pay, and is then
        priced by its own measurement. A line through measured sizes would hide steps: torch's
        int4 CPU kernel works in blocks of 4 rows, so a forward over 5 tokens costs 1.35x one
        over 4 (and 4 tokens only 1.3x one), and no line through 1 and 9 tokens shows that.
        """
        if len(self.target_s) < 2 and tokens not in self.target_s:
            return None
        below = [n for n in self.target_s if n <= tokens]
        return self._priced(max(below) if below else min(self.target_s))

    def _priced(self, tokens: int) -> float:
        """A measured size's time now: its ratio to the current 1-token step where it has one."""
        if tokens in self.relative and 1 in self.target_s:
            return self.relative[tokens] * self.target_s[1]
        return self.target_s[tokens]

    def catch_up(self, tokens: int) -> float:
        """Time for the drafter to read `tokens` it missed; until measured, priced as drafting
        them one by one (an overestimate: reading is batched), so a probe is never underpriced."""
        measured = self.catch_up_seconds.at(tokens)
        return tokens * (self.draft_s_per_token or 0.0) if measured is None else measured


@dataclass
class Acceptance:
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
    def of(cls, probability: float, tries: float = 1.0) -> Acceptance:
        """One rate for every position, as if seen in `tries` tried first drafts."""
        return cls(accepted=[probability * tries], tried=[tries])

    @property
    def estimate(self) -> float | None:
        """Accepted over tried, all positions pooled (the rate if every position had the same)."""
        tried = sum(self.tried)
        return sum(self.accepted) / tried if tried else None

    def add(self, accepted: int, drafted: int, steady: bool = False) -> None:
        """A round drafted `drafted` tokens and the target kept the first `accepted` of them.
        `steady`: the drafter costs something, so its rates forget slowly (_STEADY_SMOOTHING)."""
        keep = 1 - (_STEADY_SMOOTHING if steady else _SMOOTHING)
        reached = min(accepted + 1, drafted)  # the kept drafts and the one rejected, if any
        grow = reached - len(self.tried)
        if grow > 0:
            self.accepted.extend([0.0] * grow)
            self.tried.extend([0.0] * grow)
        for i in range(reached):  # a round that stopped short says nothing about later positions
            self.accepted[i] = keep * self.accepted[i] + (i < accepted)
            self.tried[i] = keep * self.tried[i] + 1

    def rates(self, k: int, prior: Acceptance | None = None) -> list[float] | None:
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
    # Acceptance comes in streaks (a draft that copies a passage keeps being right), so it is
    # estimated apart for rounds after one that kept all its drafts and for the others.
    after_streak: Acceptance = field(default_factory=Acceptance)
    after_miss: Acceptance = field(default_factory=Acceptance)  # after a rejection or a plain round
    in_streak: bool = False  # the last round drafted and kept every draft
    exploration_s: float = 0.0  # time put aside by plain rounds for probing a paused draft
    timed: bool = True  # False: no cost gate; the lengths depend only on acceptance (reproducible)
    # A drafter that weighs its own options each round (the hybrid: which source, how long, or
    # nothing) is gated by itself: the policy only calibrates and caps its length. Pooled over
    # its sources, the acceptance and cost seen here would gate it wrongly (a few misses of its
    # head pause its lookup too).
    drafter_chooses: bool = False

    def __post_init__(self) -> None:
        lowest, highest = DRAFT_LENGTH_BOUNDS
        if not lowest <= self.k <= highest:
            raise ValueError(f"draft_length must be between {lowest} and {highest}, got {self.k}")
        if not self.timed:
            self.costs = StepCosts(timed=False)
        # A k the caller asks for explicitly is always reachable.
        self.lowest, self.highest = min(self.lowest, self.k), max(self.highest, self.k)

    def next_draft_length(self, room: int, lag: int = 0) -> int:
        """Drafts to ask for this round (0: a plain step). `room`: tokens the reply may still
        take (caps the draft); `lag`: tokens the drafter must read before it can propose."""
        if room <= 0:
            return 0
        if not self.adaptive or not self.timed:
            return min(self.k, room)
        if self.costs.target(1) is None:
            return 0  # calibrate: one plain step measures what speculation must beat
        if self.drafter_chooses:
            return min(self.highest, room)
        # A free drafter's length is the cost model's choice over the whole range (verify cost
        # is what matters, and it need not grow with length); a costly one stays within k.
        free = self.drafting_is_free()
        k_max = min(self.highest if free else self.k, room)
        rates = self.rates(k_max)
        if rates is None or not self.costs.drafting_measured():
            return k_max  # nothing measured yet: try speculation
        fastest, tokens = self._fastest_length(rates)
        pays = tokens / self._round_s(fastest) * self.costs.target(1) > _MIN_GAIN
        if free:  # never paused: plain rounds keep its estimate current (observe_unverified)
            return fastest if pays else 0
        if pays and self._saving_s(fastest, tokens, room) > self.costs.catch_up(lag):
            return fastest
        # A probe, when it is due: the acceptance or the costs may have changed. At the length
        # that would pay most: for a weak drafter one draft, which is cheap and samples the
        # position that decides whether it pays (probing at k, a head right a third of the time
        # failed most probes, its estimate sank further, and it sat out whole replies).
        if self.exploration_s >= self._probe_loss_s(fastest, tokens, lag):
            self.exploration_s = 0.0
            return fastest
        return 0

    def rates(self, k: int) -> list[float] | None:
        """The acceptance to expect this round at draft positions 1..k: its state's (in a streak
        or not), leaning on the other state's where this one has few tried drafts."""
        this, other = (self.after_streak, self.after_miss) if self.in_streak else (self.after_miss, self.after_streak)
        return this.rates(k, prior=other)

    def drafting_is_free(self) -> bool:
        """Whether proposals cost next to nothing next to a target step (e.g. prompt lookup), so
        plain rounds ask for one to compare. Never for a drafter that chooses: it may be costly."""
        if self.drafter_chooses:
            return False
        step, per_token = self.costs.target(1), self.costs.draft_s_per_token
        return step is not None and per_token is not None and per_token < _CHEAP * step

    def observe_unverified(self, first_draft_matched: bool) -> None:
        """A free drafter's proposal was not verified; its first token did (not) match the target's."""
        if self.adaptive:
            self.after_miss.add(accepted=int(first_draft_matched), drafted=1)

    def update(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """Learn from one round: its acceptance and its measured costs."""
        self.costs.record_target(drafted + 1, verify_s)
        self.costs.record_draft(drafted, draft_s)
        if not self.adaptive:
            return
        if drafted == 0:
            self.exploration_s += _EXPLORATION_SHARE * verify_s
            self.in_streak = False
            return
        state = self.after_streak if self.in_streak else self.after_miss
        state.add(accepted, drafted, steady=not self.drafting_is_free())
        self.in_streak = accepted == drafted
        rate = accepted / drafted
        if rate >= self.raise_at:
            self.k = min(self.k + 1, self.highest)
        elif rate < self.lower_below:
            self.k = max(self.k - 1, self.lowest)

    def _round_s(self, k: int) -> float:
        """Measured (or interpolated) time of a round that drafts k tokens and verifies them."""
        return k * self.costs.draft_s_per_token + self.costs.target(k + 1)

    def _saving_s(self, k: int, tokens: float, room: int) -> float:
        """Time drafting k per round, `tokens` expected from each, saves over plain decoding on the
        `room` tokens left."""
        return room * (self.costs.target(1) - self._round_s(k) / tokens)

    def _probe_loss_s(self, k: int, tokens: float, lag: int) -> float:
        """What one probe of k drafts (`tokens` expected) is expected to cost beyond the plain
        steps it replaces, counting its tokens at the gain drafting must promise: a draft
        predicted to gain a little less than that would otherwise probe at no cost, that is every
        round."""
        gained = tokens * self.costs.target(1) / _MIN_GAIN
        return self.costs.catch_up(lag) + max(self._round_s(k) - gained, 0.0)

    def _fastest_length(self, rates: list[float]) -> tuple[int, float]:
        """The k in [1, len(rates)] with the most expected tokens per second, and its expected
        tokens per round."""
        tokens = expected_tokens_by_length(rates)  # tokens[k]: k drafts
        # max keeps the first of equals, the shortest: one draft may pay where two don't
        fastest = max(range(1, len(rates) + 1), key=lambda k: tokens[k] / self._round_s(k))
        return fastest, tokens[fastest]


# ---------------------------------------------------------------- choosing among drafters


@dataclass
class DraftSource:
    """One drafter a hybrid can ask this round: its measured acceptance and drafting cost."""

    name: str
    acceptance: Acceptance = field(default_factory=Acceptance)
    draft_s_per_token: float | None = None
    steady: bool = False  # a learned drafter: its acceptance forgets slowly (see _STEADY_SMOOTHING)

    def record(self, drafted: int, accepted: int, seconds: float) -> None:
        """Learn from a verified proposal of this source."""
        if drafted:
            self.acceptance.add(accepted, drafted, steady=self.steady)
            self.draft_s_per_token = _average(self.draft_s_per_token, seconds / drafted)


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
