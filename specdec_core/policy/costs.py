"""What the policy measures: target forwards by token count, drafting per token, and a
drafter's catch-up (medians of recent samples, and a line for the catch-up)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

SMOOTHING = 0.25  # weight of the newest sample in the running averages
# Step and drafting times are the median of this many recent samples, not a running average: on
# a shared machine one step the scheduler stalled (hundreds of ms against 20-90) lifted the
# average plain step for many rounds, and as a drafting round never times a plain step, what a
# verify cost next to it (its ratio) read low and the policy kept drafting at a loss: measured
# under sampling (T = 0.7), the offline EAGLE head drafted on a plain step priced at 183 ms
# where plain steps took 93 (docs/benchmarks.md, sampled decoding).
WINDOW = 9


def average(old: float | None, new: float) -> float:
    """The running average `old` with the sample `new` (SMOOTHING)."""
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


@dataclass
class LineFit:
    """seconds = fixed + per_token * tokens, fitted by least squares to recent samples (each
    older sample's weight fading by SMOOTHING per new one).

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
        keep = 1 - SMOOTHING
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
    """Measured times: target forwards by token count and drafting per token (each the median
    of its last WINDOW samples), and the drafter's catch-up by tokens read (a line: one pass plus
    a cost per token).

    A forward over n > 1 tokens is remembered relative to the 1-token step of its time, and
    priced at that ratio times the current 1-token step. Plain steps come every few rounds and
    follow the context as it grows; a verify size may not have run since the context was much
    shorter (an engine keeps its costs across replies), and its seconds from then would make
    drafting look cheap on a long prompt: 12.6 ms remembered against 17.2 ms measured there.
    A ratio is never below 1: a forward over more tokens never costs less than over one, and
    one that read so was timed against a plain step that the machine had slowed.
    """

    target_s: dict[int, float] = field(default_factory=dict)  # tokens in the forward -> seconds
    draft_s_per_token: float | None = None
    catch_up_seconds: LineFit = field(default_factory=LineFit)  # tokens read -> seconds
    timed: bool = True  # False: records nothing, so every choice made from these stays untimed
    # tokens (> 1) -> the forward's time over the 1-token step's average when it ran
    relative: dict[int, float] = field(default_factory=dict)
    # The recent samples the medians above are taken over, by what they measure.
    _samples: dict = field(default_factory=dict, repr=False)

    def record_target(self, tokens: int, seconds: float) -> None:
        if not self.timed:
            return
        self.target_s[tokens] = self._recent_median(("target", tokens), seconds)
        step = self.target_s.get(1)
        if tokens > 1 and step:
            self.relative[tokens] = max(self._recent_median(("relative", tokens), seconds / step), 1.0)

    def record_draft(self, tokens: int, seconds: float) -> None:
        if tokens and self.timed:
            self.draft_s_per_token = self._recent_median(("draft", 1), seconds / tokens)

    def _recent_median(self, key: tuple[str, int], sample: float) -> float:
        """The median of the last WINDOW samples under `key`, `sample` added."""
        window = self._samples.setdefault(key, deque(maxlen=WINDOW))
        window.append(sample)
        return median(window)

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
