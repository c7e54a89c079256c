"""Self-speculative drafting: the target drafts for itself with some of its layers skipped.

No second model and no training (LayerSkip, Draft&Verify, SWIFT): a draft step runs the target's
embedding, a subset of its decoder layers (always its first), its final norm and its head. An
early exit is the subset "the first m layers". The subset is chosen once per target, at the
drafter's first bind, by a short calibration (`calibrate`): the target decodes a fixed text
greedily, and for a few candidate subsets the drafter measures how often its greedy token is the
target's (teacher-forced over that continuation: the chance a draft token is accepted) and what
its step costs against the target's; it keeps the subset with the highest predicted speedup
(theory.expected_tokens over the measured draft and verify costs), and drafts nothing at all
where no subset is predicted to pay (a 135M model has few layers to spare).

Weights: the drafter runs the target's own modules (features.untapped's twins, which share
every parameter and leave the EAGLE feature taps alone): no copy. Cache: its own KV cache, for
the layers it runs only (a DynamicCache laid out like the target's, the skipped layers' slots
left empty). The target's cache is not shared, even for the layers before the first skipped one
whose keys and values would be the same: it lives inside the target's decode path (a growing
eager cache, a compiled step's static one, a GPU's), the verify step rewrites its last positions
every round, and reading it would tie this drafter to each path. The drafter's cache costs
kept/all of the target's per token, and it is kept across generations like a draft model's.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ..decoding.base import decoder_of
from ..decoding.eager import CachedModel, KeptRunner
from ..decoding.features import decoder_layers, untapped
from ..drafter import NO_DRAFT, Draft, Drafter
from ..errors import LoadError
from ..policy.bounds import MAX_DRAFT_LENGTH
from ..sampling import SamplingParams
from ..theory import expected_tokens
from .model import ModelDrafter

# The fixed text the calibration decodes from: plain prose of the kind a chat asks for.
CALIBRATION_TEXT = (
    "Question: Why do leaves change colour in autumn?\n"
    "Answer: In autumn the days get shorter and cooler, so trees stop making chlorophyll, the green "
    "pigment that captures sunlight. As the chlorophyll breaks down,"
)
CALIBRATION_TOKENS = 32  # greedy tokens of the target compared with each candidate's
# Timing: every timed forward (the target's 1-token step, its verify forwards, each candidate's
# draft step) runs once per round, all of them in each round, and each keeps the quickest of its
# rounds. Interleaved so that a burst of someone else's work slows every candidate alike: timed
# one candidate after another, a burst that covered one candidate's tries put early exit at half
# the layers at 1.19x a target step and a 5-in-6 subset at 0.42x (a CI run on 2 shared cores).
# On CPU the calibration times on one thread, in that thread's CPU time: on a shared machine the
# wall clock measures whoever else runs, and so does the process's CPU time with two threads, which
# spin at each barrier while the other waits for a core (two calibrations of the offline preset on
# 2 busy cores put the draft step at 0.07x and at 4x a target step by the wall clock, and verify
# steps at 4-17x a 1-token step in process CPU time). Only the ratios are used: a draft step's holds
# from one thread to two (the same operators on the same rows); a verify step's is higher on one
# thread (the 4-bit target's 5-token verify: 1.9x a step, against 1.6x on two), which errs on the
# side of not drafting.
_TIMED_ROUNDS = 5
# A subset must promise this much over plain decoding to draft at all (as the draft policy asks:
# the estimates are noisy, and a marginal gain predicted from them is as likely a loss).
MIN_SPEEDUP = 1.05


@dataclass(frozen=True)
class SkipPattern:
    """Which target layers a draft step runs (indices into the decoder stack, in order)."""

    name: str
    kept: tuple[int, ...]

    def describe(self, layers: int) -> str:
        return f"{self.name} ({len(self.kept)} of {layers} layers)"


def candidate_patterns(layers: int) -> list[SkipPattern]:
    """The subsets the calibration tries on a stack of `layers`: early exits at 1/2, 2/3 and 3/4,
    and skips inside the middle half (every other layer, every third). Each keeps layer 0 (the
    cache's length and masks are read from it) and skips at least one layer."""
    quarter = layers // 4
    middle = range(quarter, layers - quarter)
    candidates = [SkipPattern(f"early exit at {label}", tuple(range(max(1, round(layers * share)))))
                  for label, share in (("1/2", 1 / 2), ("2/3", 2 / 3), ("3/4", 3 / 4))]
    candidates += [
        SkipPattern("every other middle layer skipped",
                    tuple(i for i in range(layers) if i not in middle or (i - quarter) % 2 == 0)),
        SkipPattern("every third middle layer skipped",
                    tuple(i for i in range(layers) if i not in middle or (i - quarter) % 3 != 1)),
    ]
    unique: dict[tuple[int, ...], SkipPattern] = {}
    for pattern in candidates:
        if 0 in pattern.kept and len(pattern.kept) < layers:
            unique.setdefault(pattern.kept, pattern)
    return list(unique.values())


@dataclass(frozen=True)
class PatternScore:
    """What the calibration measured for one subset."""

    pattern: SkipPattern
    acceptance: float  # share of the target's greedy tokens the subset's greedy token matched
    cost: float  # a draft step's time over a target 1-token step's
    draft_length: int  # the length that maximises the predicted speedup
    speedup: float  # predicted over plain decoding at that length


@dataclass(frozen=True)
class Calibration:
    """The calibration's choice and its numbers, for the app's models panel and the bench."""

    layers: int
    scores: tuple[PatternScore, ...]
    chosen: PatternScore | None  # None: no subset pays; the drafter drafts nothing
    target_step_s: float
    verify_cost: dict[int, float]  # tokens in a verify forward -> its time over a 1-token step's
    seconds: float  # the calibration's own time (wall clock)
    cpu_seconds: float  # the CPU time its timed thread took (on CPU: all of its work, on one thread)

    @property
    def best(self) -> PatternScore:
        return max(self.scores, key=lambda score: score.speedup)

    def line(self) -> str:
        """One line: the choice (or why none) with its acceptance, cost and predicted speedup."""
        best = self.best
        numbers = (f"{best.pattern.describe(self.layers)}: acceptance {best.acceptance:.2f}, draft step "
                   f"{best.cost:.2f}x a target step, predicted {best.speedup:.2f}x at k={best.draft_length}")
        verdict = "" if self.chosen else f"; under {MIN_SPEEDUP}x, so it drafts nothing"
        return f"layer skip: {numbers}{verdict} (calibrated in {self.seconds:.1f} s, {self.cpu_seconds:.1f} s of CPU)"

    def as_dict(self) -> dict:
        """For the bench's results.json: the line, the chosen layers and every subset's numbers."""
        return {
            "line": self.line(), "layers": self.layers, "chosen": self.chosen.pattern.name if self.chosen else None,
            "kept": list(self.chosen.pattern.kept) if self.chosen else [],
            "target_step_ms": self.target_step_s * 1e3, "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "verify_cost": {str(tokens): cost for tokens, cost in self.verify_cost.items()},
            "patterns": [{"name": s.pattern.name, "kept": list(s.pattern.kept), "acceptance": s.acceptance,
                          "cost": s.cost, "draft_length": s.draft_length, "speedup": s.speedup} for s in self.scores],
        }


def skipping_model(target, kept: tuple[int, ...]) -> nn.Module:
    """The target running only the decoder layers `kept`: a twin sharing every module and weight
    (features.untapped), its decoder's layer stack replaced by the subset. The twin shares the
    target's config too, so a cache made for it (CachedModel: growing_cache(config)) has a slot
    for every target layer, and the kept layers, keeping their own layer_idx, write to their own
    slots; the decoder's loop over `layers[:num_hidden_layers]` runs just the subset."""
    twin = untapped(target)
    decoder = decoder_of(twin)
    layers = decoder_layers(twin)
    decoder._modules["layers"] = nn.ModuleList([layers[i] for i in kept])  # the twin's own dict
    return twin


def _layer_count(target) -> int:
    return len(decoder_layers(target))


def _check_target(target) -> None:
    """A target whose layers differ in kind (sliding-window layers among full ones) would hand a
    skipped layer's mask to the next: refuse it in one line."""
    types = getattr(target.config.get_text_config(), "layer_types", None) or ()
    if len(set(types)) > 1:
        raise LoadError(f"drafter layer_skip needs a target whose layers all attend alike; this one mixes "
                        f"{', '.join(sorted(set(types)))}: use another drafter")
    if _layer_count(target) < 2:
        raise LoadError("drafter layer_skip needs a target with at least 2 decoder layers: use another drafter")


class LayerSkipDrafter(Drafter):
    """Drafts with the target's own layers, a calibrated subset of them (module docstring)."""

    name = "layer_skip"

    def __init__(self, kept_layers: tuple[int, ...] | None = None, min_confidence: float = 0.0) -> None:
        """kept_layers: run exactly these layers (no calibration; tests and experiments);
        None: calibrate at the first bind."""
        self.fixed = tuple(kept_layers) if kept_layers is not None else None
        self.min_confidence = min_confidence
        self.calibration: Calibration | None = None
        self.kept: tuple[int, ...] | None = None  # None: drafting nothing (no subset pays)
        self.model: nn.Module | None = None  # the skipping twin of the target
        self._target = None
        self._chain: ModelDrafter | None = None  # drafts with the twin as a draft model would

    # ---- the Drafter interface -----------------------------------------------------------

    def bind(self, target_model, tokenizer) -> None:
        if target_model is not self._target:
            self._use(target_model, tokenizer)
        if self._chain is not None:
            self._chain.bind(target_model, tokenizer)

    def reset(self, prompt_ids: list[int]) -> None:
        if self._chain is not None:
            self._chain.reset(prompt_ids)

    def lag(self, context: list[int]) -> int:
        return self._chain.lag(context) if self._chain is not None else 0

    def catch_up(self, context: list[int]) -> None:
        if self._chain is not None:
            self._chain.catch_up(context)

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        return self._chain.propose(context, k, params, generator) if self._chain is not None else NO_DRAFT

    def accepted(self, n: int) -> None:
        if self._chain is not None:
            self._chain.accepted(n)

    def unverified(self) -> None:
        if self._chain is not None:
            self._chain.unverified()

    def release(self, context: list[int] | None) -> None:
        if self._chain is not None:
            self._chain.release(context)

    def memory_bytes(self) -> int:
        """Bytes of the drafter's own KV cache (the kept layers' keys and values) now."""
        return self._kept_runner.memory_bytes() if self._chain is not None else 0

    # ---- internals -----------------------------------------------------------------------

    def _use(self, target, tokenizer) -> None:
        """Choose the layers for this target (calibrating unless they were given) and build the twin."""
        _check_target(target)
        layers = _layer_count(target)
        if self.fixed is not None:
            if not self.fixed or self.fixed[0] != 0 or list(self.fixed) != sorted(set(self.fixed)) or self.fixed[-1] >= layers:
                raise ValueError(f"kept_layers must start with layer 0 and name distinct layers below {layers} in "
                                 f"order, got {list(self.fixed)}")
            self.kept = self.fixed
        else:
            self.calibration = calibrate(target, tokenizer)
            chosen = self.calibration.chosen
            self.kept = chosen.pattern.kept if chosen else None
        self._target = target
        self.model = skipping_model(target, self.kept) if self.kept else None
        self._chain = None
        if self.model is not None:
            self._kept_runner = KeptRunner(CachedModel, self.model)
            self._chain = ModelDrafter(self.model, min_confidence=self.min_confidence, kept=self._kept_runner)


# ---- the calibration ---------------------------------------------------------------------


@contextmanager
def _step_clock(model):
    """The clock the calibration times `model`'s steps with (see _TIMED_ROUNDS): on CPU one torch
    thread and its CPU time while it runs, on an accelerator the wall clock."""
    if model.device.type != "cpu":
        yield time.perf_counter
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield time.thread_time
    finally:
        torch.set_num_threads(threads)


@torch.inference_mode()
def calibrate(target, tokenizer, patterns: list[SkipPattern] | None = None,
              new_tokens: int = CALIBRATION_TOKENS) -> Calibration:
    """Score each candidate subset on CALIBRATION_TEXT (module docstring) and pick the best."""
    started = time.perf_counter()
    cpu_started = time.thread_time()
    layers = _layer_count(target)
    patterns = patterns or candidate_patterns(layers)
    plain = untapped(target)  # the target's own forwards here must not fill an engine's taps
    prompt = tokenizer(CALIBRATION_TEXT)["input_ids"]
    target_runner, continuation = _greedy_continuation(plain, prompt, new_tokens)
    draft_runners = [CachedModel(skipping_model(target, pattern.kept)) for pattern in patterns]
    acceptances = [_acceptance(runner, prompt, continuation) for runner in draft_runners]
    with _step_clock(target) as clock:
        verify_s, draft_s = _timed_rounds(target_runner, draft_runners, prompt + continuation, clock)
    step_s = verify_s[1]
    verify_cost = {tokens: max(seconds / step_s, 1.0)  # never cheaper than a step (noise)
                   for tokens, seconds in verify_s.items() if tokens > 1}
    scores = tuple(_score(pattern, acceptance, seconds / step_s, verify_cost)
                   for pattern, acceptance, seconds in zip(patterns, acceptances, draft_s))
    best = max(scores, key=lambda score: score.speedup)
    return Calibration(layers=layers, scores=scores, chosen=best if best.speedup >= MIN_SPEEDUP else None,
                       target_step_s=step_s, verify_cost=verify_cost, seconds=time.perf_counter() - started,
                       cpu_seconds=time.thread_time() - cpu_started)


def _greedy_continuation(model, prompt: list[int], count: int) -> tuple[CachedModel, list[int]]:
    """The target's greedy tokens after `prompt`, and its runner (holding all but the last)."""
    runner = CachedModel(model)
    logits = runner.forward(prompt, last_only=True)[-1]
    tokens = [int(logits.argmax())]
    while len(tokens) < count:
        logits = runner.forward(tokens[-1:], last_only=True)[-1]
        tokens.append(int(logits.argmax()))
    return runner, tokens


def _acceptance(runner: CachedModel, prompt: list[int], continuation: list[int]) -> float:
    """How often a draft model's greedy token is the target's over `continuation`, teacher-forced
    (its runner then holds all but the continuation's last token)."""
    logits = runner.forward(prompt + continuation[:-1])
    guesses = logits[len(prompt) - 1 :].argmax(-1).tolist()
    return sum(g == t for g, t in zip(guesses, continuation)) / len(continuation)


def _timed_rounds(target: CachedModel, drafts: list[CachedModel], sequence: list[int],
                  clock) -> tuple[dict[int, float], list[float]]:
    """The quickest time, over _TIMED_ROUNDS interleaved rounds, of the target's forward over 1 to
    MAX_DRAFT_LENGTH + 1 tokens (a step, then the last token and its drafts) and of each draft
    model's 1-token step, all at the end of `sequence` (which the runners hold, but its last
    token); each forward is cropped off again."""
    start = len(sequence) - MAX_DRAFT_LENGTH - 1
    for runner in (target, *drafts):
        runner.crop(start)

    def timed(runner: CachedModel, tokens: int) -> float:
        began = clock()
        runner.forward(sequence[start : start + tokens], last_only=tokens == 1)
        seconds = clock() - began
        runner.crop(start)
        return seconds

    verify_s = {tokens: float("inf") for tokens in range(1, MAX_DRAFT_LENGTH + 2)}
    draft_s = [float("inf")] * len(drafts)
    for _ in range(_TIMED_ROUNDS):
        for tokens in verify_s:
            verify_s[tokens] = min(verify_s[tokens], timed(target, tokens))
        for index, runner in enumerate(drafts):
            draft_s[index] = min(draft_s[index], timed(runner, 1))
    return verify_s, draft_s


def _score(pattern: SkipPattern, acceptance: float, cost: float, verify_cost: dict[int, float]) -> PatternScore:
    speedup, length = max(
        (expected_tokens(acceptance, g) / (g * cost + verify_cost[g + 1]), g) for g in range(1, MAX_DRAFT_LENGTH + 1))
    return PatternScore(pattern, acceptance, cost, length, speedup)

