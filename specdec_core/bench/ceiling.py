"""The engine's ceiling: speedup at controlled acceptance, against Leviathan et al.'s prediction.

    python -m specdec_core.bench ceiling --preset smollm2-135m-local --prompts 4 --max-new-tokens 128
    python -m specdec_core.bench ceiling --target-config qwen2.5-7b --device cuda --compile
    (today's spelling, `python -m specdec_core.bench --ceiling ...`, works too)

A SyntheticDrafter (synthetic.py) proposes each token of the target's own greedy reply right
with probability a. For each a, each fixed draft length k and the adaptive policy, the engine
decodes every prompt; its decoding time (the prompt prefill left out, as the formula leaves it
out) is compared with ours-baseline's on the same prompts, runs interleaved. The prediction is
Leviathan's (1 - a^(g+1)) / ((1 - a)(g c + v_g)) with v_g (a verify step over 1 + g tokens /
a 1-token step) probed through the same runner the engine uses (compiled steps when they are in
use) and c measured from the drafter's time; for the adaptive engine it is the best fixed g's.
Efficiency = measured / predicted. Where the rounds' time goes is measured, too: drafting,
target forwards, acceptance, rollback (cache crops), and the rest (the engine's Python).

The command (cli.py) writes DIR/ceiling.json, DIR/ceiling.md and DIR/ceiling.png (speedup
against a; ceiling_report.py).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..engine import SpeculativeEngine
from ..decoding.eager import CachedModel
from ..sampling import SamplingParams
from ..theory import expected_tokens, leviathan_speedup
from .architectures import NumberTokenizer, random_model
from .cost_model import time_steps
from .machine import device_name, load_average, synchronizer, versions
from .synthetic import COST_MODES, SyntheticDrafter

ACCEPTANCES = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
DRAFT_LENGTHS = (2, 4, 6, 8)
ADAPTIVE = "adaptive"
BASELINE = "ours-baseline"
PROBE_SIZES = tuple(range(1, 10))  # a 1-token step and verify steps over 1 + g tokens, g <= 8
PARTS = ("draft", "target_forward", "acceptance", "rollback", "other")


@dataclass
class Subject:
    """What the ceiling runs on: a target, its tokenizer, the runner it decodes with, prompts."""

    target: object
    tokenizer: object
    prompts: list[list[int]]
    make_runner: Callable = CachedModel
    description: dict = field(default_factory=dict)


def subject_from_preset(name: str, config_path=None, compile: bool | str | None = None, prompts: int = 4,
                        cpu_weights: str | None = None) -> Subject:
    """A preset's target (no draft model), the project's own questions as chat prompts."""
    from ..chat import chat_prompt_ids
    from ..presets.loading import load_preset
    from .questions import load_questions

    models = load_preset(name, config_path, load_draft=False, compile=compile, cpu_weights=cpu_weights)
    models.wait_for_compiling()  # (compile: auto on CPU compiles in the background) time the path it keeps
    questions = _spread(load_questions(None, None, None), prompts)
    ids = [chat_prompt_ids(models.tokenizer, [{"role": "user", "content": q.prompt}]) for q in questions]
    description = {
        "preset": models.preset.name,
        "target": models.preset.target.label,
        "dtype": str(models.target.dtype).removeprefix("torch."),
        "device": str(models.target.device),
        "decode_path": models.decode_path,
        "prompts": [q.question_id for q in questions],
        "notes": models.notes,
    }
    return Subject(models.target, models.tokenizer, ids, models.target_runner or CachedModel, description)


def subject_from_architecture(
    name: str,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    compile: bool = False,
    prompts: int = 4,
    prompt_tokens: int = 128,
    max_new_tokens: int = 128,
    seed: int = 0,
    progress: bool = True,
) -> Subject:
    """A random-weight model of a known architecture (or a config.json), random-token prompts;
    compile=True decodes through compiled static-cache steps (StaticSteps), as the app on a GPU."""
    from ..decoding.static import StaticSteps

    device = torch.device(device)
    target = random_model(name, dtype, device, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    vocab = target.config.vocab_size
    ids = [torch.randint(0, vocab, (prompt_tokens,), generator=generator).tolist() for _ in range(prompts)]
    make_runner: Callable = CachedModel
    if compile:
        make_runner = StaticSteps(target, max_length=prompt_tokens + max_new_tokens + 16, name="target",
                                  progress=progress)
    description = {
        "architecture": name,
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "decode_path": getattr(make_runner, "decode_path", "eager dynamic cache"),
        "compile_s": getattr(make_runner, "warmup_s", None),
        "prompt_tokens": prompt_tokens,
        "weights": "random (step costs depend on the shapes only)",
    }
    return Subject(target, NumberTokenizer(), ids, make_runner, description)


# ---------------------------------------------------------------- timing a round's parts


class _RoundClock:
    """Seconds spent in the target runner during one generation: prefill, forwards, crops."""

    def __init__(self, device: torch.device) -> None:
        self._sync = synchronizer(device)
        self.reset()

    def reset(self) -> None:
        self.prefill_s = self.forward_s = self.rollback_s = 0.0
        self.forwards = 0


class _TimedRunner:
    """A target runner (CachedModel's interface) that times its forwards and crops. The ceiling's
    drafter proposes chains, so it verifies no trees."""

    max_tree_nodes = 0

    def __init__(self, runner, clock: _RoundClock) -> None:
        self._runner, self._clock = runner, clock

    @property
    def length(self) -> int:
        return self._runner.length

    def begin(self) -> None:
        self._runner.begin()

    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        clock = self._clock
        started = time.perf_counter()
        logits = self._runner.forward(token_ids, last_only)
        clock._sync()  # on CUDA: the forward's own time, not the next host sync's
        seconds = time.perf_counter() - started
        if last_only:  # the engine's prefill (its round forwards want every position)
            clock.prefill_s += seconds
        else:
            clock.forward_s += seconds
            clock.forwards += 1
        return logits

    def crop(self, keep: int) -> None:
        started = time.perf_counter()
        self._runner.crop(keep)
        self._clock.rollback_s += time.perf_counter() - started


@dataclass
class _Tally:
    """Sums over one setting's timed runs."""

    new_tokens: int = 0
    decode_s: float = 0.0
    forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    parts_s: dict = field(default_factory=lambda: {p: 0.0 for p in PARTS})
    identical: bool = True

    def add(self, stats, clock: _RoundClock, rounds: list[tuple[int, int]], same: bool) -> None:
        decode = stats.wall_s - clock.prefill_s
        self.new_tokens += stats.new_tokens
        self.decode_s += decode
        self.forwards += clock.forwards
        self.drafted += stats.drafted_tokens
        self.accepted += stats.accepted_tokens
        self.rejections += sum(accepted < drafted for drafted, accepted in rounds)
        accept = stats.verify_s - clock.prefill_s - clock.forward_s
        parts = {"draft": stats.draft_s, "target_forward": clock.forward_s, "acceptance": accept,
                 "rollback": clock.rollback_s}
        parts["other"] = decode - sum(parts.values())
        for name, seconds in parts.items():
            self.parts_s[name] += seconds
        self.identical &= same


# ---------------------------------------------------------------- the run


def run_ceiling(
    subject: Subject,
    *,
    acceptances=ACCEPTANCES,
    draft_lengths=DRAFT_LENGTHS,
    adaptive: bool = True,
    draft_cost: float = 0.0,
    cost_mode: str = "sleep",
    max_new_tokens: int = 128,
    repeats: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Measure every (a, setting) against ours-baseline; the JSON-ready result (module docstring).

    draft_cost: c, the drafter's cost per drafted token as a share of a measured target step
    (0: free); it is paid by sleeping or spinning (cost_mode)."""
    from tqdm.auto import tqdm

    _check(acceptances, draft_lengths, adaptive, draft_cost, cost_mode, max_new_tokens, repeats, subject.prompts)
    device = subject.target.device
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    clock = _RoundClock(device)

    def engine(drafter=None, k: int = 4, adaptive_k: bool = False) -> SpeculativeEngine:
        return SpeculativeEngine(subject.target, subject.tokenizer, drafter=drafter, draft_length=k,
                                 adaptive=adaptive_k, make_runner=lambda m: _TimedRunner(subject.make_runner(m), clock))

    load_before = load_average()
    started = time.perf_counter()
    baseline = engine()
    # The target's own greedy replies (also a warm-up); each run frees its runner (a static cache).
    references = [_generate(baseline, p, [], params, clock, seed=0)[2] for p in subject.prompts]
    costs = probe_costs(subject, max_new_tokens)
    cost_s = draft_cost * costs["target_step_ms"] / 1e3
    settings = [*(f"k={k}" for k in draft_lengths), *([ADAPTIVE] if adaptive else [])]
    engines = {(BASELINE, None): baseline}
    for a in acceptances:
        for s in settings:
            drafter = SyntheticDrafter(a, cost_s=cost_s, cost_mode=cost_mode, seed=seed)
            k = 4 if s == ADAPTIVE else int(s.removeprefix("k="))
            engines[s, a] = engine(drafter, k, adaptive_k=s == ADAPTIVE)
    warm = dataclasses.replace(params, max_new_tokens=min(16, max_new_tokens))
    for key, e in engines.items():  # one untimed short run each (compiles nothing new: same runner)
        _generate(e, subject.prompts[0], references[0], warm, clock, seed=-1)
    tallies = {key: _Tally() for key in engines}
    order = list(engines)
    bar = tqdm(total=len(order) * len(subject.prompts) * repeats, desc="ceiling", unit="run",
               file=sys.stderr, disable=not progress)
    for i, prompt in enumerate(subject.prompts):
        for r in range(repeats):
            shift = (i * repeats + r) % len(order)
            for key in order[shift:] + order[:shift]:  # rotating order: drift hits all settings alike
                stats, rounds, tokens = _generate(engines[key], prompt, references[i], params, clock, seed=i * 1000 + r)
                tallies[key].add(stats, clock, rounds, tokens == references[i])
                bar.update(1)
    bar.close()
    result = {
        "subject": subject.description,
        "machine": {"load_before": load_before, "load_after": load_average(), "torch_threads": torch.get_num_threads(),
                    "device": device_name(device)},
        "versions": versions(),
        "settings": {"acceptances": list(acceptances), "draft_lengths": list(draft_lengths), "adaptive": adaptive,
                     "draft_cost_c": draft_cost, "cost_mode": cost_mode, "prompts": len(subject.prompts),
                     "prompt_tokens": [len(p) for p in subject.prompts], "max_new_tokens": max_new_tokens,
                     "repeats": repeats, "elapsed_s": None},
        "costs": costs,
        "baseline": _baseline_figures(tallies[BASELINE, None]),
        "results": [],
    }
    for (s, a), tally in tallies.items():
        if s == BASELINE:
            continue
        result["results"].append(_figures(s, a, tally, tallies[BASELINE, None], costs))
    result["settings"]["elapsed_s"] = round(time.perf_counter() - started, 1)
    result["identical"] = all(t.identical for t in tallies.values())
    return result


def _generate(engine: SpeculativeEngine, prompt, reference, params, clock: _RoundClock, seed: int):
    """One generation from an empty cache: (stats, rounds, tokens)."""
    engine.forget()
    if isinstance(engine.drafter, SyntheticDrafter):
        engine.drafter.set_reference(prompt + reference, seed=seed)
    clock.reset()
    result = engine.generate(prompt, params)
    rounds = list(result.stats.rounds)
    engine.forget()  # frees the runner (a static cache slot) for the next engine
    return result.stats, rounds, result.token_ids


def probe_costs(subject: Subject, max_new_tokens: int, repeats: int = 7) -> dict:
    """Target step and verify times through the engine's own runner, at a mid-reply context."""
    prompt = sorted(subject.prompts, key=len)[(len(subject.prompts) - 1) // 2]
    context = len(prompt) + max_new_tokens // 2
    tokens = (prompt * (context // len(prompt) + 2))[: context + max(PROBE_SIZES)]
    ms = time_steps(subject.make_runner, subject.target, tokens, context, list(PROBE_SIZES), repeats,
                    subject.target.device)
    step = ms[1]
    return {
        "context_tokens": context,
        "target_step_ms": round(step, 3),
        "verify_ms": {str(size - 1): round(t, 3) for size, t in ms.items() if size > 1},
        "v": {str(size - 1): round(t / step, 4) for size, t in ms.items() if size > 1},
        "runner": getattr(subject.make_runner, "decode_path", "eager dynamic cache"),
    }


def _figures(setting: str, a: float, tally: _Tally, base: _Tally, costs: dict) -> dict:
    step_s = costs["target_step_ms"] / 1e3
    v = {int(g): ratio for g, ratio in costs["v"].items()}
    c = tally.parts_s["draft"] / tally.drafted / step_s if tally.drafted else 0.0
    tried = tally.accepted + tally.rejections
    realised = tally.accepted / tried if tried else None
    g, predicted = _prediction(setting, a, c, v)
    # The drafter's right/wrong draws are random: over a few hundred drafts their rate strays from
    # a by a few points. The prediction at the rate it realised separates that luck from the engine.
    predicted_realised = _prediction(setting, realised, c, v)[1] if realised is not None else None
    measured = base.decode_s / tally.decode_s if tally.decode_s else None
    rounds = max(tally.forwards, 1)
    return {
        "acceptance": a,
        "setting": setting,
        "tokens_per_target_forward": round(tally.new_tokens / rounds, 3),
        "expected_tokens_per_forward": round(expected_tokens(a, g), 3),
        "tokens_per_second": round(tally.new_tokens / tally.decode_s, 2) if tally.decode_s else None,
        "speedup": round(measured, 3) if measured else None,
        "predicted_speedup": round(predicted, 3),
        "predicted_g": g,
        "efficiency": round(measured / predicted, 3) if measured else None,
        "c": round(c, 4),
        "measured_acceptance": round(realised, 3) if realised is not None else None,
        "predicted_at_measured_acceptance": round(predicted_realised, 3) if predicted_realised else None,
        "efficiency_at_measured_acceptance": round(measured / predicted_realised, 3)
        if measured and predicted_realised else None,
        "mean_draft_length": round(tally.drafted / rounds, 2),
        "ms_per_round": {p: round(1e3 * s / rounds, 3) for p, s in tally.parts_s.items()},
        "identical": tally.identical,
    }


def _baseline_figures(tally: _Tally) -> dict:
    rounds = max(tally.forwards, 1)
    return {
        "tokens_per_second": round(tally.new_tokens / tally.decode_s, 2) if tally.decode_s else None,
        "new_tokens": tally.new_tokens,
        "ms_per_round": {p: round(1e3 * s / rounds, 3) for p, s in tally.parts_s.items()},
    }


def _check(acceptances, draft_lengths, adaptive, draft_cost, cost_mode, max_new_tokens, repeats, prompts) -> None:
    if not acceptances or any(not 0.0 <= a <= 1.0 for a in acceptances):
        raise ValueError("--acceptance takes values in [0, 1], e.g. 0.5,0.8,1.0")
    if any(not 1 <= k <= max(PROBE_SIZES) - 1 for k in draft_lengths) or (not draft_lengths and not adaptive):
        raise ValueError(f"--draft-lengths takes values from 1 to {max(PROBE_SIZES) - 1} (or leave adaptive on)")
    if draft_cost < 0:
        raise ValueError(f"--draft-cost must be >= 0 (a share of a target step), got {draft_cost}")
    if cost_mode not in COST_MODES:
        raise ValueError(f"--draft-cost-mode must be one of {', '.join(COST_MODES)}")
    if max_new_tokens < 1 or repeats < 1 or not prompts:
        raise ValueError("--max-new-tokens, --repeats and --prompts must be >= 1")


def _spread(questions: list, count: int) -> list:
    """`count` questions spread over the families (the file lists them family by family)."""
    if count < 1:
        raise ValueError(f"--prompts must be >= 1, got {count}")
    step = max(len(questions) // count, 1)
    return questions[::step][:count]


# ---------------------------------------------------------------- the prediction


def _prediction(setting: str, a: float, c: float, v: dict[int, float]) -> tuple[int, float]:
    """(g, Leviathan's speedup) for a fixed k=g, or for the adaptive engine the best fixed g's."""
    if setting == ADAPTIVE:
        return max(((g, leviathan_speedup(a, g, c, v[g])) for g in sorted(v)), key=lambda t: t[1])
    g = int(setting.removeprefix("k="))
    return g, leviathan_speedup(a, g, c, v[min(g, max(v))])
