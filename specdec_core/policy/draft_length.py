"""The draft-length policy: how many tokens to draft next round, and whether drafting pays at all.

Two layers:
- the draft length k follows acceptance: a round with at least `raise_at` of its drafts
  accepted raises k by one, one under `lower_below` lowers it by one, within [lowest, highest];
- measured costs decide whether a round should draft: with the acceptance seen so far (by draft
  position, and estimated apart within streaks of fully kept drafts and after misses, as copying
  comes in streaks) and the measured draft and verify times, a chain of k' <= k drafts, or a
  tree where one was measured faster (tree_size.py), must promise MIN_GAIN more tokens per second
  than a plain decoding step, and the tokens left must repay the drafter's catch-up (reading a
  new prompt, or what it missed while paused). If nothing pays, the engine decodes plainly. It
  probes again (drafts once, at the length that would pay most, to re-measure) when the time
  saved for exploration covers what the probe is expected to lose: each plain round puts a fixed
  share of its time aside, so probing a draft that doesn't pay never costs more than that share,
  however dear its catch-up.
  A drafter whose proposals cost next to nothing (prompt lookup) is never paused: each plain
  round still asks it, and whether its first token matched the target's keeps the acceptance
  estimate current, so drafting resumes as soon as copying does.

An untimed policy (timed=False, what a seeded generation uses) keeps only the first layer: every
round drafts k, and k follows acceptance alone, so the same tokens give the same lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..theory import expected_tokens_by_length
from .acceptance import AcceptanceByPosition
from .bounds import DEFAULT_DRAFT_LENGTH, DRAFT_LENGTH_BOUNDS, MAX_DRAFT_LENGTH, MIN_DRAFT_LENGTH, MIN_GAIN
from .costs import StepCosts
from .tree_size import TreeSizePolicy

_EXPLORATION_SHARE = 0.02  # of plain decoding time, what probes of a non-paying draft may lose
_CHEAP = 0.05  # a drafter costing under this share of a target step per token is "free"


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
    after_streak: AcceptanceByPosition = field(default_factory=AcceptanceByPosition)
    after_miss: AcceptanceByPosition = field(default_factory=AcceptanceByPosition)  # after a rejection or a plain round
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
        self.trees = TreeSizePolicy(self.costs, self.adaptive)  # sizes tree drafts by the same costs

    def next_draft_length(self, room: int, lag: int = 0, tree_nodes: int = 0) -> int:
        """Drafts to ask for this round (0: a plain step); a tree round's depth. `room`: tokens
        the reply may still take (caps the draft); `lag`: tokens the drafter must read before it
        can propose; `tree_nodes`: the most nodes a tree may have this generation (0: chains)."""
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
        # The best round on offer: the chain the acceptance by position prices, or, when one was
        # measured faster, the fastest tree (k deep; its size is tree_budget's choice).
        length, rate = fastest, tokens / self._round_s(fastest)
        tree_rate = self.trees.fastest_tree_rate(tree_nodes)
        if tree_rate > rate:
            length, rate = k_max, tree_rate
        pays = rate * self.costs.target(1) > MIN_GAIN
        if free:  # never paused: plain rounds keep its estimate current (observe_unverified)
            return length if pays else 0
        if pays and self._saving_s(rate, room) > self.costs.catch_up(lag):
            return length
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

    def update(self, drafted: int, accepted: int, draft_s: float, verify_s: float, depth: int | None = None,
               line: tuple[int, int] | None = None) -> None:
        """Learn from one round: its acceptance and its measured costs. A tree round drafted
        `drafted` nodes (what its verify step cost is measured by) `depth` deep (what k follows)
        and kept a path of `accepted`; `line` is its first-ranked line as (length, kept)
        (Draft.first_ranked_line). The acceptance by position learns from that line only: it
        prices chains, and a tree keeps a path more often than its best chain would (any sibling
        may be kept). Counted from whole tree rounds, it priced chains at the tree's acceptance,
        and rounds went on drafting 4-16 node trees that a chain's price had approved: 0.64x
        plain decoding on compiled CPU steps. A chain's depth and line are its length."""
        self.costs.record_target(drafted + 1, verify_s)
        self.costs.record_draft(drafted, draft_s)
        if drafted:
            self.trees.record(drafted, accepted, draft_s)
        if not self.adaptive:
            return
        if drafted == 0:
            self.exploration_s += _EXPLORATION_SHARE * verify_s
            self.in_streak = False
            return
        depth = drafted if depth is None else depth
        line_length, line_kept = (depth, accepted) if line is None else line
        state = self.after_streak if self.in_streak else self.after_miss
        state.add(line_kept, line_length, steady=not self.drafting_is_free())
        self.in_streak = line_kept == line_length
        rate = accepted / depth
        if rate >= self.raise_at:
            self.k = min(self.k + 1, self.highest)
        elif rate < self.lower_below:
            self.k = max(self.k - 1, self.lowest)

    def tree_nodes(self, asked: int | None, verifiable: int) -> int:
        """The most draft nodes a round may verify as a tree this generation (0: chains only):
        what the request asked for, within what the target's runner verifies (`verifiable`).
        Unasked, as many as the longest chain's verify step reads. Each round's own budget,
        within this bound, is tree_budget's."""
        wanted = DRAFT_LENGTH_BOUNDS[1] if asked is None else asked
        return max(0, min(wanted, verifiable))

    def tree_budget(self, allowed: int) -> int:
        """The node budget of this drafting round's tree, at most `allowed` (0: a chain), by the
        measured tokens per second of each budget against a plain step's (tree_size.py)."""
        return self.trees.choose(allowed)

    def _round_s(self, k: int) -> float:
        """Measured (or interpolated) time of a round that drafts k tokens and verifies them."""
        return k * self.costs.draft_s_per_token + self.costs.target(k + 1)

    def _saving_s(self, rate: float, room: int) -> float:
        """Time rounds giving `rate` tokens per second save over plain decoding on the `room`
        tokens left."""
        return room * (self.costs.target(1) - 1.0 / rate)

    def _probe_loss_s(self, k: int, tokens: float, lag: int) -> float:
        """What one probe of k drafts (`tokens` expected) is expected to cost beyond the plain
        steps it replaces, counting its tokens at the gain drafting must promise: a draft
        predicted to gain a little less than that would otherwise probe at no cost, that is every
        round."""
        gained = tokens * self.costs.target(1) / MIN_GAIN
        return self.costs.catch_up(lag) + max(self._round_s(k) - gained, 0.0)

    def _fastest_length(self, rates: list[float]) -> tuple[int, float]:
        """The k in [1, len(rates)] with the most expected tokens per second, and its expected
        tokens per round."""
        tokens = expected_tokens_by_length(rates)  # tokens[k]: k drafts
        # max keeps the first of equals, the shortest: one draft may pay where two don't
        fastest = max(range(1, len(rates) + 1), key=lambda k: tokens[k] / self._round_s(k))
        return fastest, tokens[fastest]
