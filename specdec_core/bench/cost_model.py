"""Cost model: per-step costs of the eager and the compiled decode paths, without real weights.

    python -m specdec_core.cost_model                    # Qwen2.5-7B over 0.5B shapes on CUDA
    python -m specdec_core.bench --cost-model ...        # the same, through the benchmark CLI
    python -m specdec_core.cost_model --target-config smollm2-135m --draft-config tiny --device cpu

It builds random-weight models of the given architectures (step time depends on the shapes, not
on the values), then measures, for the eager dynamic cache and the compiled static cache (and,
on CPU, the eager cache on prepacked weights, mode `packed`):
target 1-token step, target verify of k+1 tokens for k = 1..max_k, draft 1-token step; c (draft
step / target step); baseline tokens/s and its fraction of the memory-bandwidth ceiling
(device bandwidth / weight bytes read per step); and the speedup Leviathan et al. predict at
acceptance 0.6, 0.7, 0.8 (arXiv 2211.17192, with the measured verify cost in place of 1):

    speedup(a, g) = (1 - a^(g+1)) / (1 - a) / (g*c + v_g),   v_g = verify(g) / target step

reported for the best draft length g. Writes OUT.json and OUT.md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .machine import load_average
from ..theory import leviathan_speedup

ACCEPTANCE_RATES = (0.6, 0.7, 0.8)
MODES = ("eager", "compiled", "packed")  # packed: eager on prepacked weights (CPU; what the app runs there)

# config.json values of the published models (random weights; only the shapes matter).
ARCHITECTURES: dict[str, dict] = {
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
        max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
        max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
        max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
    ),
    "smollm2-135m": dict(
        model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
        max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
    ),
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
    ),
    "llama-3.2-1b": dict(
        model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
    ),
    # For tests: seconds on a CPU.
    "tiny": dict(
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, max_position_embeddings=512,
    ),
    "tiny-draft": dict(
        model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, vocab_size=1000, max_position_embeddings=512,
    ),
}
DEFAULTS = {"cuda": ("qwen2.5-7b", "qwen2.5-0.5b"), "cpu": ("qwen2.5-0.5b", "smollm2-135m")}

# Peak memory bandwidth in GB/s by GPU name (first match wins: specific names come first).
GPU_BANDWIDTH_GBS: tuple[tuple[str, float], ...] = (
    ("H200", 4800), ("H100 PCIe", 2000), ("H100 NVL", 3900), ("H100", 3350), ("GH200", 4000),
    ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935), ("A100", 1555),
    ("L40S", 864), ("L40", 864), ("L4", 300), ("A10G", 600), ("A10", 600),
    ("RTX 6000 Ada", 960), ("RTX A6000", 768), ("RTX 4090", 1008), ("RTX 3090", 936),
    ("V100", 900), ("T4", 320),
)


def main(argv: list[str] | None = None) -> int:
    """The command line; `--cost-model` is accepted and ignored, so bench.py can pass its argv on."""
    args = _parser().parse_args([a for a in (sys.argv[1:] if argv is None else argv) if a != "--cost-model"])
    try:
        device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
        target, draft = DEFAULTS["cuda" if device.type == "cuda" else "cpu"]
        result = run_cost_model(
            args.target_config or target,
            args.draft_config or draft,
            device=device,
            dtype=args.dtype,
            context=args.context,
            max_k=args.max_k,
            repeats=args.repeats,
            modes=tuple(args.modes.split(",")),
            bandwidth_gbs=args.bandwidth_gbs,
            seed=args.seed,
            cache_length=args.cache_length,
            eagle=args.eagle,
        )
    except (ValueError, OSError, MemoryError, torch.OutOfMemoryError) as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    table = markdown_table(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(table + "\n")
    print(table)
    print(f"\nwrote {out.with_suffix('.json')} and {out.with_suffix('.md')}", file=sys.stderr)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdec_core.cost_model", description=__doc__.splitlines()[0])
    names = ", ".join(ARCHITECTURES)
    p.add_argument("--target-config", help=f"architecture preset ({names}) or a config.json path "
                   "(default: qwen2.5-7b on CUDA, qwen2.5-0.5b on CPU)")
    p.add_argument("--draft-config", help="the draft's, likewise (default: qwen2.5-0.5b on CUDA, smollm2-135m on CPU)")
    p.add_argument("--device", default="auto", help="auto (cuda if available) | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--context", type=int, default=256, help="tokens already in the cache when timing (default 256)")
    p.add_argument("--max-k", type=int, default=8, help="verify steps are timed for k = 1..max_k (default 8)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per step; the median is reported")
    p.add_argument("--modes", default="eager,compiled", help="comma-separated: eager, compiled, packed "
                   "(eager on prepacked weights; CPU only)")
    p.add_argument("--bandwidth-gbs", type=float, help="device memory bandwidth in GB/s (default: a table of "
                   "known GPUs; on CPU a measured memcpy)")
    p.add_argument("--cache-length", type=int, help="static cache slots of the compiled mode (default: the app's, "
                   "which every step attends over)")
    p.add_argument("--eagle", action="store_true", help="also time an EAGLE-3 head of the target's shape "
                   "(random weights, eager) and its c")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_out/cost_model", help="writes OUT.json and OUT.md")
    return p


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
    torch_dtype = _dtype(dtype, device)
    configs = {"target": load_architecture(target_config), "draft": load_architecture(draft_config)}
    if not built:
        _check_memory(configs.values(), torch_dtype, device)
    bandwidth, bandwidth_source = device_bandwidth(device, bandwidth_gbs)
    result: dict = {
        "device": _device_name(device),
        "dtype": str(torch_dtype).removeprefix("torch."),
        "bandwidth_gbs": round(bandwidth / 1e9, 1),
        "bandwidth_source": bandwidth_source,
        "context_tokens": context,
        "static_cache_tokens": None,
        "repeats": repeats,
        "torch": torch.__version__,
        "transformers": _transformers_version(),
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
            models[role] = build_model(configs[role], torch_dtype, device)
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
            tokens = _random_tokens(model.config.vocab_size, context + max(sizes))
            timings[role] = {"ms": time_steps(factory, model, tokens, context, sizes, repeats, device), **info}
        result["modes"][mode] = summarize(timings, result["models"]["target"]["weight_bytes_per_step"], bandwidth)
        if mode == "compiled":
            result["static_cache_tokens"] = runners["target"].max_length
    if eagle:
        result["eagle"] = eagle_costs(models["target"], context, repeats, device, result["modes"])
        _free(device)
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
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
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


def _random_tokens(vocab: int, count: int) -> list[int]:
    generator = torch.Generator().manual_seed(1234)
    return torch.randint(0, vocab, (count,), generator=generator).tolist()


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
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    width = head.config.hidden_size
    with torch.inference_mode():
        cache = growing_cache(head.config)
        tokens = torch.tensor([_random_tokens(head.config.vocab_size, context)], device=device)
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


# ---------------------------------------------------------------- models and the device


def load_architecture(name_or_path: str) -> dict:
    """A preset name of ARCHITECTURES, or a config.json path; returns the config dict."""
    if name_or_path in ARCHITECTURES:
        return dict(ARCHITECTURES[name_or_path])
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise ValueError(
            f"unknown architecture '{name_or_path}': use one of {', '.join(ARCHITECTURES)} or a config.json path"
        )
    config = json.loads(path.read_text())
    if "model_type" not in config:
        raise ValueError(f"{path} has no model_type: give a Hugging Face config.json")
    return config


def build_model(config: dict, dtype: torch.dtype, device: torch.device):
    """A random-weight causal LM of this architecture, built directly on the device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "torch_dtype", "dtype")}
    hf_config = AutoConfig.for_model(config["model_type"], **fields)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    return model.eval()


def weight_bytes_per_step(model) -> int:
    """Bytes of weights one decoding step reads: all parameters but an untied input embedding
    (a lookup reads one row of it; a tied one is read in full as the output head)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight is not embedding:
        total -= embedding.numel() * embedding.element_size()
    return total


def device_bandwidth(device: torch.device, override_gbs: float | None = None) -> tuple[float, str]:
    """(bytes/s, where the number comes from): the flag, the GPU table, or a CPU memcpy."""
    if override_gbs:
        return override_gbs * 1e9, "--bandwidth-gbs"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, gbs in GPU_BANDWIDTH_GBS:
            if key in name:
                return gbs * 1e9, f"table: {key}"
        raise ValueError(f"no bandwidth known for GPU '{name}': pass --bandwidth-gbs")
    return measure_memcpy_bandwidth(), "measured CPU memcpy (read + write)"


def measure_memcpy_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a large tensor copy on the CPU, counting the read and the write."""
    source = torch.ones(megabytes * 2**20 // 4)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - started)
    return 2 * source.numel() * 4 / best


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def _check_memory(configs, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse, in one line, models whose weights would not fit (a 7B model in fp32 on a laptop)."""
    need = sum(_parameter_estimate(c) for c in configs) * torch.tensor([], dtype=dtype).element_size()
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return
    if need > 0.8 * free:
        raise ValueError(
            f"the two models need about {need / 1e9:.1f} GB and {free / 1e9:.1f} GB is free on {device}: "
            "pick smaller --target-config / --draft-config"
        )


def _parameter_estimate(config: dict) -> int:
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or h // heads
    attention = h * heads * head_dim * 2 + h * kv * head_dim * 2
    embeddings = config["vocab_size"] * h * (1 if config.get("tie_word_embeddings", True) else 2)
    return layers * (attention + 3 * h * i) + embeddings


def _free(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads of {os.cpu_count()} cores"


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


# ---------------------------------------------------------------- the table


def markdown_table(result: dict) -> str:
    """The result as a markdown table: one column per mode."""
    modes = list(result["modes"])
    target, draft = result["models"]["target"], result["models"]["draft"]
    lines = [
        f"Cost model on {result['device']} ({result['dtype']}), target {target['config']} "
        f"({_millions(target['parameters'])} params), draft {draft['config']} ({_millions(draft['parameters'])}), "
        f"{result['context_tokens']} tokens of context, median of {result['repeats']} calls, random weights. "
        f"Bandwidth {result['bandwidth_gbs']:g} GB/s ({result['bandwidth_source']})."
        + (f" Compiled: the app's steps (sizes padded up to the next compiled one) on its static cache of "
           f"{result['static_cache_tokens']} slots, which every step attends over." if result.get("static_cache_tokens") else ""),
        "",
        "| | " + " | ".join(modes) + " |",
        "|---|" + "---|" * len(modes),
    ]

    def row(label: str, cell: Callable[[dict], str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(result["modes"][m]) for m in modes) + " |")

    row("decode path (target / draft)", lambda r: f"{r['target_path']} / {r['draft_path']}")
    row("target 1-token step (ms)", lambda r: f"{r['target_step_ms']:.2f}")
    ks = list(result["modes"][modes[0]]["verify_ms"])
    for k in ks:
        row(f"target verify k={k} (ms)", lambda r, k=k: f"{r['verify_ms'][k]:.2f}")
    row("draft 1-token step (ms)", lambda r: f"{r['draft_step_ms']:.2f}")
    row("c = draft step / target step", lambda r: f"{r['c']:.3f}")
    row("baseline tokens/s", lambda r: f"{r['baseline_tokens_per_s']:.1f}")
    row("fraction of bandwidth ceiling", lambda r: f"{r['bandwidth_fraction']:.0%} of {r['bandwidth_ceiling_tokens_per_s']:.0f} tok/s")
    for a in result["modes"][modes[0]]["predicted_speedup"]:
        row(f"predicted speedup at acceptance {a} (best k)",
            lambda r, a=a: f"{r['predicted_speedup'][a]['speedup']:.2f}x (k={r['predicted_speedup'][a]['draft_length']})")
    if result.get("eagle"):
        head = result["eagle"]
        lines.append(f"| EAGLE-3 head step (ms; {_millions(head['parameters'])} params, eager) | "
                     + " | ".join(f"{head['step_ms']:.2f}" for _ in modes) + " |")
        lines.append("| c of the EAGLE-3 head | " + " | ".join(f"{head['modes'][m]['c']:.3f}" for m in modes) + " |")
        for a in head["modes"][modes[0]]["predicted_speedup"]:
            cells = [head["modes"][m]["predicted_speedup"][a] for m in modes]
            lines.append(f"| EAGLE-3: predicted speedup at acceptance {a} (best k) | "
                         + " | ".join(f"{x['speedup']:.2f}x (k={x['draft_length']})" for x in cells) + " |")
    fallbacks = [f"{m} {role}: {why}" for m in modes for role, why in result["modes"][m]["fallback"].items() if why]
    if fallbacks:
        lines += ["", "Compilation fell back to eager: " + "; ".join(fallbacks)]
    return "\n".join(lines)


def _millions(count: int) -> str:
    return f"{count / 1e6:,.0f}M" if count >= 1e7 else f"{count / 1e6:.2f}M"


if __name__ == "__main__":
    sys.exit(main())
