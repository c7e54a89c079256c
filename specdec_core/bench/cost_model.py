"""Cost model: per-step costs of the eager and the compiled decode paths, without real weights.

    python -m specdec_core.bench cost-model              # Qwen2.5-7B over 0.5B shapes on CUDA
    python -m specdec_core.cost_model ...                # the same (so is bench --cost-model)
    python -m specdec_core.bench cost-model --target-config smollm2-135m --draft-config tiny --device cpu

It builds random-weight models of the given architectures (step time depends on the shapes, not
on the values), then measures, for the eager dynamic cache and the compiled static cache (and,
on CPU, the eager cache on prepacked weights, mode `packed`):
target 1-token step, target verify of k+1 tokens for k = 1..max_k, draft 1-token step; c (draft
step / target step); baseline tokens/s and its fraction of the memory-bandwidth ceiling
(device bandwidth / weight bytes read per step); and the speedup Leviathan et al. predict at
acceptance 0.6, 0.7, 0.8 (arXiv 2211.17192, with the measured verify cost in place of 1):

    speedup(a, g) = (1 - a^(g+1)) / (1 - a) / (g*c + v_g),   v_g = verify(g) / target step

reported for the best draft length g. The command (cli.py) writes OUT.json and OUT.md
(cost_model_report.py) and prints the table.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from ..theory import leviathan_speedup
from .architectures import build_model, check_memory, load_architecture, random_tokens
from .machine import device_bandwidth, device_name, free_memory, load_average, package_versions, synchronizer

ACCEPTANCE_RATES = (0.6, 0.7, 0.8)
MODES = ("eager", "compiled", "packed")  # packed: eager on prepacked weights (CPU; what the app runs there)
# The (target, draft) architectures measured when none is named, by device type.
DEFAULTS = {"cuda": ("qwen2.5-7b", "qwen2.5-0.5b"), "cpu": ("qwen2.5-0.5b", "smollm2-135m")}


# ---------------------------------------------------------------- the measurement


def run_cost_model(
    target_config: str,
    draft_config: str,
    *,
    device: torch.device | str = "cpu",
    dtype: str = "auto",
    context: int = 256,
    max_k: int = 8,
    repeats: int = 20,
    modes: tuple[str, ...] = MODES,
    bandwidth_gbs: float | None = None,
    seed: int = 0,
    progress: bool = True,
    cache_length: int | None = None,
    built: dict | None = None,
    runners: dict | None = None,
    eagle: bool = False,
) -> dict:
    """Measure both models in each mode; the JSON-ready result (see the module docstring).

    The compiled mode runs the app's configuration: its step sizes (padded up) and a static
    cache of `cache_length` slots (default: the app's), which every step attends over.
    built: {"target": model, "draft": model} already on the device (their configs are still
    named for the report); runners: a dict that receives the compiled StaticSteps by role, so a
    caller (the GPU check) can decode with them afterwards without compiling again.
    eagle: also time a randomly initialised EAGLE-3 head of the target's shape (eagerly, as the
    EagleDrafter runs it) and report its c against each mode's target step."""
    device = torch.device(device)
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"modes must be among {', '.join(MODES)}, got {', '.join(modes) or 'none'}")
    if "packed" in modes and device.type != "cpu":
        raise ValueError("mode packed is for CPU (prepacked oneDNN weights): use --device cpu")
    if max_k < 1 or context < 1 or repeats < 1:
        raise ValueError("--max-k, --context and --repeats must be >= 1")
    from ..decoding.static import DEFAULT_MAX_LENGTH

    if "compiled" in modes and (cache_length or DEFAULT_MAX_LENGTH) < context + max_k + 1:
        raise ValueError(f"the static cache ({cache_length or DEFAULT_MAX_LENGTH} tokens) can't hold --context "
                         f"{context} plus a verify of {max_k + 1}: pass a larger --cache-length")
    weights_dtype = torch_dtype(dtype, device)
    configs = {"target": load_architecture(target_config), "draft": load_architecture(draft_config)}
    if not built:
        check_memory(configs.values(), weights_dtype, device)
    bandwidth, bandwidth_source = device_bandwidth(device, bandwidth_gbs)
    result: dict = {
        "device": device_name(device),
        "dtype": str(weights_dtype).removeprefix("torch."),
        "bandwidth_gbs": round(bandwidth / 1e9, 1),
        "bandwidth_source": bandwidth_source,
        "context_tokens": context,
        "static_cache_tokens": None,
        "repeats": repeats,
        "torch": torch.__version__,
        "transformers": package_versions(["transformers"])["transformers"],
        "machine_load": load_average(),
        "weights": "random (step costs depend on the shapes only)",
        "models": {},
        "modes": {},
    }
    models = dict(built or {})
    runners = {} if runners is None else runners
    for role, seed_offset in (("target", 0), ("draft", 1)):
        if role not in models:
            torch.manual_seed(seed + seed_offset)
            models[role] = build_model(configs[role], weights_dtype, device)
        result["models"][role] = {
            "config": target_config if role == "target" else draft_config,
            "parameters": sum(p.numel() for p in models[role].parameters()),
            "weight_bytes_per_step": weight_bytes_per_step(models[role]),
        }
    verify_sizes = list(range(2, max_k + 2))
    for mode in modes:
        timings = {}
        for role, sizes in (("target", [1, *verify_sizes]), ("draft", [1])):
            model = _packed_copy(models[role]) if mode == "packed" else models[role]
            factory, info = _runner_factory(mode, model, role, cache_length, progress, runners)
            tokens = random_tokens(model.config.vocab_size, context + max(sizes))
            timings[role] = {"ms": time_steps(factory, model, tokens, context, sizes, repeats, device), **info}
        result["modes"][mode] = summarize(timings, result["models"]["target"]["weight_bytes_per_step"], bandwidth)
        if mode == "compiled":
            result["static_cache_tokens"] = runners["target"].max_length
    if eagle:
        result["eagle"] = eagle_costs(models["target"], context, repeats, device, result["modes"])
        free_memory()
    return result


def summarize(timings: dict, target_weight_bytes: int, bandwidth: float) -> dict:
    """Turn step times (ms by step size) into the reported numbers."""
    target_ms, draft_ms = timings["target"]["ms"], timings["draft"]["ms"]
    step = target_ms[1]
    verify = {k: target_ms[k + 1] for k in sorted(s - 1 for s in target_ms if s > 1)}
    c = draft_ms[1] / step
    baseline = 1000.0 / step
    ceiling = bandwidth / target_weight_bytes
    relative_verify = {k: ms / step for k, ms in verify.items()}
    return {
        "target_path": timings["target"]["path"],
        "draft_path": timings["draft"]["path"],
        "compile_s": {role: timings[role]["compile_s"] for role in ("target", "draft")},
        "fallback": {role: timings[role]["fallback"] for role in ("target", "draft")},
        "target_step_ms": round(step, 3),
        "verify_ms": {str(k): round(ms, 3) for k, ms in verify.items()},
        "draft_step_ms": round(draft_ms[1], 3),
        "c": round(c, 4),
        "baseline_tokens_per_s": round(baseline, 2),
        "bandwidth_ceiling_tokens_per_s": round(ceiling, 2),
        "bandwidth_fraction": round(baseline / ceiling, 4),
        "predicted_speedup": {
            str(a): best_speedup(a, c, relative_verify) for a in ACCEPTANCE_RATES
        },
    }


def best_speedup(a: float, c: float, relative_verify: dict[int, float]) -> dict:
    """The draft length g (among those measured) with the highest predicted speedup."""
    g, speedup = max(((g, leviathan_speedup(a, g, c, v)) for g, v in relative_verify.items()), key=lambda t: t[1])
    return {"speedup": round(speedup, 3), "draft_length": g}


def time_steps(
    factory: Callable, model, tokens: list[int], context: int, sizes: list[int], repeats: int, device: torch.device
) -> dict[int, float]:
    """Median ms of a forward over tokens[context : context + size] after the first `context` are
    cached, for each size (two untimed calls first; the cache is cropped back after each call)."""
    runner = factory(model)
    if context:
        runner.forward(tokens[:context], last_only=True)
    sync = synchronizer(device)
    medians = {}
    for size in sizes:
        new = tokens[context : context + size]
        times = []
        for i in range(repeats + 2):  # two untimed calls first
            sync()
            started = time.perf_counter()
            runner.forward(new)
            sync()
            if i >= 2:
                times.append((time.perf_counter() - started) * 1000.0)
            runner.crop(context)
        medians[size] = statistics.median(times)
    return medians


def _packed_copy(model):
    """A copy of `model` with its linear layers prepacked (packed_linear), as the app loads it on CPU."""
    import copy

    from ..kernels.packed_linear import pack_linear_layers

    packed = copy.deepcopy(model)
    _, problem = pack_linear_layers(packed)
    if problem:
        raise ValueError(f"mode packed: {problem}")
    return packed


def _runner_factory(mode: str, model, role: str, cache_length: int | None, progress: bool, runners: dict):
    """(make_runner, info) for one mode: eager and packed = CachedModel, compiled = StaticSteps
    as the app builds them (its step sizes, its cache length unless one is given)."""
    from ..decoding.eager import CachedModel
    from ..decoding.static import DEFAULT_STEP_SIZES, DRAFT_STEP_SIZES, EAGER_DYNAMIC, StaticSteps

    if mode in ("eager", "packed"):
        path = EAGER_DYNAMIC + (", prepacked weights" if mode == "packed" else "")
        return CachedModel, {"path": path, "compile_s": None, "fallback": None}
    steps = runners.get(role)
    if steps is None:
        sizes = DEFAULT_STEP_SIZES if role == "target" else DRAFT_STEP_SIZES
        steps = runners[role] = StaticSteps(model, max_length=cache_length, step_sizes=sizes, compile=True,
                                            progress=progress, name=role)
    info = {"path": steps.decode_path, "compile_s": round(steps.warmup_s, 1), "fallback": steps.fallback_reason,
            "step_sizes": list(steps.step_sizes)}
    return steps, info


def eagle_costs(target, context: int, repeats: int, device: torch.device, modes: dict) -> dict:
    """An EAGLE-3 head of the target's shape (random weights): its draft step time and, for each
    mode's target, c and the predicted speedups."""
    from ..drafters import Eagle3Head

    head = Eagle3Head.random(target.config, dtype=next(target.parameters()).dtype).to(device)
    step_ms = time_eagle_step(head, target, context, repeats, device)
    out = {"parameters": head.parameter_count, "draft_vocab_size": head.draft_vocab_size,
           "layer_ids": list(head.layer_ids), "step_ms": round(step_ms, 3), "path": "eager", "modes": {}}
    for mode, numbers in modes.items():
        step = numbers["target_step_ms"]
        c = step_ms / step
        relative_verify = {int(k): ms / step for k, ms in numbers["verify_ms"].items()}
        out["modes"][mode] = {"c": round(c, 4), "predicted_speedup": {
            str(a): best_speedup(a, c, relative_verify) for a in ACCEPTANCE_RATES}}
    del head
    return out


def time_eagle_step(head, target, context: int, repeats: int, device: torch.device) -> float:
    """Median ms of one EAGLE draft step after `context` positions are in the head's cache: the
    logits of the last output, its argmax, that token's embedding, and the head's layer on it."""
    from ..decoding.eager import growing_cache

    embed = target.get_input_embeddings()
    sync = synchronizer(device)
    width = head.config.hidden_size
    with torch.inference_mode():
        cache = growing_cache(head.config)
        tokens = torch.tensor([random_tokens(head.config.vocab_size, context)], device=device)
        features = torch.randn(1, context, head.fc.in_features, device=device, dtype=head.fc.weight.dtype)
        out = head(embed(tokens), head.project(features), cache)[0, -1]
        times = []
        for i in range(repeats + 2):
            sync()
            started = time.perf_counter()
            token = head.to_target_ids(head.logits(out).argmax(-1))
            step = head(embed(token.view(1, 1)), out.view(1, 1, width), cache)
            sync()
            if i >= 2:
                times.append((time.perf_counter() - started) * 1000.0)
            cache.crop(-1)
        del step
    return statistics.median(times)


def torch_dtype(name: str, device: torch.device) -> torch.dtype:
    """A --dtype value: auto is bfloat16 on CUDA, float32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def weight_bytes_per_step(model) -> int:
    """Bytes of weights one decoding step reads: all parameters but an untied input embedding
    (a lookup reads one row of it; a tied one is read in full as the output head)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight is not embedding:
        total -= embedding.numel() * embedding.element_size()
    return total
