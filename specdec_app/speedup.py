"""The live speedup of the chat app: which plain-decoding rate a reply is compared with, the
theory beside it and the race chart's data (the session's history of replies: history.py).

Every speedup here compares decode with decode: a reply's decode rate (tokens after its first
round, over the engine time after its first token; Stats.decode_tokens_per_second) over a plain
decode rate measured at a comparable prompt length. The time to first token (the prompt
reading, short when the kept cache already holds the conversation) is shown on its own line:
folded into a rate it credits speculation with whatever reading it was spared. Only side by side,
where both halves read the same prompt tokens alike, also gives an end-to-end figure.

Pure functions and small classes over plain values (stat dicts, token sources, times), no
gradio and no models, so they are unit-tested without a server. The app measures;
this module chooses, labels and formats.

Where the plain-decoding rate comes from, best first (`BaselineBook.choose`):
1. the latest measured baseline for the preset (a baseline reply, or the baseline half of
   side by side) whose prompt was of a comparable length;
2. the engine's own plain steps: the policy times every target forward by size, so a round
   that decodes plainly measures a plain step directly (1 / its time is a plain rate);
3. a short plain-decoding calibration run when the models load.
Each only at a comparable prompt length (attention makes a step dearer as the context grows).
Every figure shown was measured; with no comparable one measured the panel says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from .render import duration
from specdec_core.events import NodeAcceptance, RoundTally
from specdec_core.theory import expected_tokens, predicted_speedup, speedup_of_rounds

# Where a plain-decoding rate was measured (shown in the label: "measured in side-by-side").
SIDE_BY_SIDE = "side-by-side"
BASELINE_REPLY = "a baseline reply"
PLAIN_STEPS = "plain steps"
CALIBRATION = "calibration"
REPLY_SOURCES = (SIDE_BY_SIDE, BASELINE_REPLY)  # a whole plain reply, the best comparison

# Attention makes a step dearer as the context grows, so a rate measured on a much shorter or
# longer prompt is not the same target's speed: within a factor of 2, or 256 tokens, it is.
COMPARABLE_FACTOR = 2.0
COMPARABLE_TOKENS = 256
MIN_TOKENS = 4  # fewer tokens than this time the prompt read more than the decoding

# Race chart series; the measured-rate line is drawn dashed (the app's CSS matches its name).
SPECULATIVE_RUN = "speculative"
BASELINE_RUN = "baseline"
MEASURED_RATE_RUN = "baseline (measured rate)"
RACE_COLOURS = {SPECULATIVE_RUN: "#16a34a", BASELINE_RUN: "#6b7280", MEASURED_RATE_RUN: "#6b7280"}
RACE_DASHED_CSS = ('<style>#race-chart path[aria-roledescription="line mark"]'
                   f'[aria-label$="run: {MEASURED_RATE_RUN}"]{{stroke-dasharray:6 4}}</style>')


@dataclass(frozen=True)
class BaselineRate:
    """A measured plain-decoding rate of one preset on this machine."""

    tokens_per_second: float  # a decode rate: the prompt reading left out
    source: str  # SIDE_BY_SIDE | BASELINE_REPLY | PLAIN_STEPS | CALIBRATION
    measured_at: float  # time.time() when it was measured
    context_tokens: int  # prompt length it was measured at
    detail: str = ""  # how, e.g. "23 tokens in 1.04 s after the first" or "a plain step 41 ms"

    @classmethod
    def of_reply(cls, stats: Mapping, source: str, context_tokens: int, now: float,
                 detail: str = "") -> BaselineRate | None:
        """The decode rate of a finished plain reply (engine stats): its tokens after the first
        round over the time after its first token. None if too few came after it to time."""
        tokens, seconds = decode_phase(stats)
        if tokens < MIN_TOKENS or seconds <= 0:
            return None
        return cls(tokens / seconds, source, now, context_tokens,
                   detail or f"{tokens} tokens in {seconds:.2f} s after the first")

    @classmethod
    def of_plain_step(cls, step_s: float | None, context_tokens: int, now: float) -> BaselineRate | None:
        """The rate one measured plain target step implies (None: not measured)."""
        if not step_s or step_s <= 0:
            return None
        return cls(1.0 / step_s, PLAIN_STEPS, now, context_tokens, f"a plain step {step_s * 1e3:.0f} ms")


def decode_phase(stats: Mapping) -> tuple[int, float]:
    """(tokens, engine seconds) of a reply after its first token: what its decode rate divides
    (the first round's tokens came within the time to first token)."""
    tokens = int(stats.get("new_tokens", 0)) - int(stats.get("first_round_tokens", 1))
    seconds = float(stats.get("wall_s", 0.0)) - float(stats.get("ttft_s") or 0.0)
    return max(tokens, 0), seconds


def decode_rate(stats: Mapping) -> float:
    """Stats.decode_tokens_per_second of a stats dict (0.0 until a second round gave a token)."""
    tokens, seconds = decode_phase(stats)
    return tokens / seconds if tokens > 0 and seconds > 0 else 0.0


def comparable(a: int, b: int) -> bool:
    """Whether prompts of a and b tokens decode at about the same speed (see COMPARABLE_*)."""
    low, high = sorted((max(a, 1), max(b, 1)))
    return high - low <= COMPARABLE_TOKENS or high <= COMPARABLE_FACTOR * low


class BaselineBook:
    """The latest measured plain-decoding rates of each preset, shared by every session of a
    server (one machine, one set of models): one entry per preset and source kind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replies: dict[str, list[BaselineRate]] = {}  # a few latest, newest last
        self._latest: dict[tuple[str, str], BaselineRate] = {}  # (preset, PLAIN_STEPS | CALIBRATION)

    def record(self, preset: str, rate: BaselineRate | None) -> None:
        if rate is None:
            return
        with self._lock:
            if rate.source in REPLY_SOURCES:
                self._replies[preset] = [*self._replies.get(preset, [])[-15:], rate]
            else:
                self._latest[(preset, rate.source)] = rate

    def has(self, preset: str, source: str) -> bool:
        with self._lock:
            return (preset, source) in self._latest

    def choose(self, preset: str, context_tokens: int, live_plain: BaselineRate | None = None) -> BaselineRate | None:
        """The rate to compare a reply with (see the module docstring for the order), or None
        when none was measured at a prompt length comparable with `context_tokens`.

        live_plain: a plain step measured during the running reply (fresher than any recorded).
        """
        with self._lock:
            candidates = [*reversed(self._replies.get(preset, [])), live_plain,
                          self._latest.get((preset, PLAIN_STEPS)), self._latest.get((preset, CALIBRATION))]
        return next((rate for rate in candidates
                     if rate is not None and comparable(rate.context_tokens, context_tokens)), None)


# ---------------------------------------------------------------- labels


def age_text(seconds: float) -> str:
    """'just now', '40 s ago', '2 min ago', '3 h ago'."""
    if seconds < 10:
        return "just now"
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min ago"
    return f"{seconds // 3600:.0f} h ago"


_WHERE = {
    SIDE_BY_SIDE: "measured in side-by-side",
    BASELINE_REPLY: "measured in a baseline reply",
    PLAIN_STEPS: "measured from the engine's plain steps",
    CALIBRATION: "measured by a calibration at load",
}


def baseline_label(rate: BaselineRate | None, now: float) -> str:
    """'vs plain decoding 23.1 tok/s, measured in side-by-side 2 min ago (96 tokens in 4.16 s)'."""
    if rate is None:
        return ("no plain-decoding rate measured at a comparable prompt length yet: tick Baseline or "
                "side by side for one reply")
    detail = f" ({rate.detail})" if rate.detail else ""
    return (f"vs plain decoding {rate.tokens_per_second:.1f} tok/s, {_WHERE[rate.source]} "
            f"{age_text(now - rate.measured_at)}{detail}")


# ---------------------------------------------------------------- this reply's rounds and theory


@dataclass(frozen=True)
class Prediction:
    """Leviathan et al.'s speedup from this reply's acceptance and step costs; for a reply that
    verified trees, the tokens per drafting round from its per-node acceptance instead."""

    a: float  # per-token acceptance: kept drafts / (kept drafts + rejections)
    g: float  # drafts per drafting round (a tree's: its nodes)
    c: float  # drafting cost per token, in target steps
    v: float  # verify cost over 1 + g tokens, in target steps
    share: float  # share of rounds that drafted
    speedup: float
    # Trees: tokens per drafting round the per-node acceptance predicts, and the acceptance by
    # depth it came from (None / (): a chain reply, priced by Leviathan's formula from a and g).
    tree_tokens: float | None = None
    by_depth: tuple[float, ...] = ()

    @property
    def tokens(self) -> float:
        """Tokens per drafting round the prediction expects."""
        return self.tree_tokens if self.tree_tokens is not None else expected_tokens(self.a, self.g)


def predict(counts: RoundTally, stats: Mapping, step_s: Callable[[int], float | None],
            nodes: NodeAcceptance | None = None) -> Prediction | None:
    """The prediction for a reply, or None before a drafting round or a measured plain step.

    step_s(n): the measured time of a target forward over n tokens (the engine's policy).
    nodes: the reply's drafting rounds by node place (Stats.node_acceptance); once a round
    verified a tree, the tokens per drafting round come from them (a chain formula over a
    tree's node count would price 16 nodes as a 16-long chain).
    """
    drafting = counts.rounds - counts.plain_rounds
    drafted = stats.get("drafted_tokens", 0)
    step = step_s(1)
    if drafting <= 0 or drafted <= 0 or not step:
        return None
    g = drafted / drafting
    verify = step_s(round(g) + 1)
    if not verify:
        return None
    tried = counts.accepted + counts.rejections
    a = counts.accepted / tried if tried else 0.0
    c = (stats.get("draft_s", 0.0) / drafted) / step
    v = verify / step
    share = drafting / counts.rounds
    if nodes is not None and nodes.tree_rounds:
        tokens = nodes.expected_tokens()
        return Prediction(a, g, c, v, share, speedup_of_rounds(tokens, g, c, v, share), tokens,
                          tuple(nodes.acceptance_by_depth()))
    return Prediction(a, g, c, v, share, predicted_speedup(a, g, c, v, share))


# ---------------------------------------------------------------- the live figure


def speedup(tokens_per_second: float, rate: BaselineRate | None) -> float | None:
    if rate is None or rate.tokens_per_second <= 0 or tokens_per_second <= 0:
        return None
    return tokens_per_second / rate.tokens_per_second


# A measured speedup this far above the prediction means an assumption of the theory failed;
# within it, timing noise of a short reply is explanation enough.
THEORY_TOLERANCE = 1.10


def failed_assumptions(prediction: Prediction, counts: RoundTally, stats: Mapping,
                       rate: BaselineRate | None, step_s: float | None) -> list[str]:
    """Which of the prediction's assumptions this reply broke, when it beat the prediction:
    drafts kept independently at one rate a; plain decoding at one token per measured 1-token
    step; rounds that cost what the averaged step timings say."""
    reasons = []
    drafting = counts.rounds - counts.plain_rounds
    if drafting > 0:
        measured = (counts.accepted + drafting) / drafting
        independent = prediction.tokens
        if measured > THEORY_TOLERANCE * independent:
            kept = ("tree nodes kept independently at their measured per-node rates" if prediction.tree_tokens
                    is not None else f"drafts kept independently at a = {prediction.a:.2f}")
            reasons.append(f"acceptance came in streaks: {measured:.2f} tokens per drafting round, where {kept} "
                           f"give {independent:.2f}")
    if rate is not None and step_s:
        implied = 1.0 / step_s
        if rate.tokens_per_second * THEORY_TOLERANCE < implied:
            reasons.append(f"plain decoding ran at {rate.tokens_per_second:.1f} tok/s, below the {implied:.1f} "
                           "tok/s its 1-token step implies (the theory counts a plain token as one step: "
                           "the rest is overhead per token)")
    _, seconds = decode_phase(stats)
    if step_s and counts.rounds > 1 and seconds > 0:
        steps_per_round = seconds / (counts.rounds - 1) / step_s
        model = prediction.share * (prediction.g * prediction.c + prediction.v) + (1 - prediction.share)
        if steps_per_round * THEORY_TOLERANCE < model:
            reasons.append(f"rounds took {steps_per_round:.2f} steps each, less than the {model:.2f} the "
                           "averaged step timings give")
    return reasons


def theory_line(prediction: Prediction | None, value: float | None, counts: RoundTally | None = None,
                stats: Mapping | None = None, rate: BaselineRate | None = None,
                step_s: float | None = None) -> str:
    """Leviathan's prediction beside the measured decode-phase speedup `value`: their ratio, or,
    when the measurement beats the prediction by more than THEORY_TOLERANCE, why."""
    if prediction is None:
        return "Predicted (Leviathan et al.): – until a round drafts"
    if prediction.tree_tokens is not None:
        depths = ", ".join(f"{rate:.2f}" for rate in prediction.by_depth)
        line = (f"Predicted (trees, per-node acceptance): {prediction.speedup:.2f}× from "
                f"{prediction.tree_tokens:.2f} tokens per drafting round (acceptance by depth {depths}), "
                f"{prediction.g:.1f} nodes per round, c = {prediction.c:.2f}, v = {prediction.v:.2f}, "
                f"{prediction.share:.0%} of rounds drafting")
    else:
        line = (f"Predicted (Leviathan et al.): {prediction.speedup:.2f}× from a = {prediction.a:.2f}, "
                f"g = {prediction.g:.1f}, c = {prediction.c:.2f}, v = {prediction.v:.2f}, "
                f"{prediction.share:.0%} of rounds drafting")
    if value is None:
        return line
    ratio = value / prediction.speedup
    if ratio <= THEORY_TOLERANCE:
        return line + f" · efficiency {ratio:.0%} (measured / predicted)"
    reasons = failed_assumptions(prediction, counts or RoundTally(), stats or {}, rate, step_s)
    why = "; ".join(reasons) if reasons else (
        "none of its assumptions checked here failed (independent acceptance, a plain token per step, "
        "the step costs): a short reply's timing noise can do this")
    return line + f" · measured {value:.2f}× is {ratio - 1:.0%} above it: {why}"


def live_markdown(stats: Mapping | None, rate: BaselineRate | None, prediction: Prediction | None,
                  now: float, baseline_reply: bool = False, counts: RoundTally | None = None,
                  step_s: float | None = None) -> str:
    """The #speedup-live panel: this reply's decode rate over a plain decode rate (where that
    came from, how old), the time to first token on its own line, and the theory.

    counts, step_s: this reply's rounds and the measured 1-token step, to say which assumption
    failed when the measurement beats the theory."""
    if not stats:
        return "**Speedup now: –** · send a message: each speculative reply shows its speedup here"
    decode = decode_rate(stats)
    first = f"Time to first token: {duration(stats.get('ttft_s'))} (reading the prompt; not in the figure)"
    if baseline_reply:
        return (f"**Baseline reply** · plain decoding at {decode:.1f} tok/s after the first token: later "
                f"speculative replies compare with this rate\n\n{first}")
    value = speedup(decode, rate)
    figure = "–" if value is None else f"{value:.2f}×"
    shown = f"{decode:.1f} tok/s" if decode > 0 else "– tok/s (until a second round)"
    head = f"**Speedup now: {figure}** · {shown}{' ' if rate else ' · '}{baseline_label(rate, now)}"
    if rate is not None:
        head += " · both decode rates, after the first token"
    return "\n\n".join([head, first, theory_line(prediction, value, counts, stats, rate, step_s)])


def side_by_side_so_far(spec: Mapping, base: Mapping) -> str:
    """The #speedup pane while the speculative half streams against the finished baseline: the
    decode-phase figure so far (the end-to-end one waits for the end)."""
    spec_rate, base_rate = decode_rate(spec), decode_rate(base)
    if base_rate <= 0:
        return "Speedup so far: – (the baseline gave too few tokens to time its decoding)"
    if spec_rate <= 0:
        return "Speedup so far: – until the speculative half's second round · generating…"
    return (f"**Speedup so far: {spec_rate / base_rate:.2f}× decode phase** (speculative {spec_rate:.1f} tok/s "
            f"vs baseline {base_rate:.1f} tok/s after the first token) · generating…")


# ---------------------------------------------------------------- the race chart


def race_point(stats: Mapping) -> tuple[float, int]:
    """(engine seconds after the first token, tokens) of a run so far: the curves start after
    their prompt reading, so their slopes are the decode rates the speedups compare."""
    ttft = stats.get("ttft_s")
    seconds = float(stats.get("wall_s", 0.0)) - float(ttft or 0.0)
    return max(seconds, 0.0), int(stats.get("new_tokens", 0))


def race_frame(spec: Sequence[tuple[float, int]], base: Sequence[tuple[float, int]] = (),
               rate: BaselineRate | None = None, spec_run: str = SPECULATIVE_RUN) -> pd.DataFrame:
    """Tokens against seconds after the first token for a LinePlot: the reply's curve and the
    baseline's.

    `base`: a real baseline run (side by side); without one, `rate` draws the measured plain
    decode rate as a straight line from the reply's first point to its last second
    (MEASURED_RATE_RUN). spec_run: the reply's series name (BASELINE_RUN for a baseline reply).
    A series with only its origin draws nothing.
    """
    # Every series starts at the origin in every frame, used or not: the plot fixes its colours
    # and legend from the series of the first frame it draws, and would leave a new one invisible.
    rows = [(0.0, 0, run) for run in RACE_COLOURS]
    rows += [(s, n, spec_run) for s, n in spec]
    if base:
        rows += [(s, n, BASELINE_RUN) for s, n in base]
    elif rate is not None and spec:
        start = spec[0][1]  # the first round's tokens, at 0 s
        end = max(s for s, _ in spec)
        rows += [(0.0, start, MEASURED_RATE_RUN), (end, start + round(rate.tokens_per_second * end), MEASURED_RATE_RUN)]
    # Typed even when nearly empty: the plot fixes each axis's scale type from its first value.
    frame = pd.DataFrame(rows, columns=["seconds", "tokens", "run"])
    return frame.astype({"seconds": float, "tokens": int, "run": str})


class Throttle:
    """True at most once per `interval_s` (the race chart redraws less often than the text)."""

    def __init__(self, interval_s: float, clock: Callable[[], float]) -> None:
        self.interval_s, self._clock, self._last = interval_s, clock, None

    def due(self) -> bool:
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True
