"""One command that checks and measures the GPU path: `python -m specdec_core.gpu_check --out DIR`.

Random weights of real shapes (Qwen2.5-7B target, Qwen2.5-0.5B draft), no network, one GPU,
meant to finish in well under 10 minutes. Parts, each timed, each recorded as pass / fail /
not run (with the reason) in DIR/gpu_check.json and DIR/gpu_check.md, rewritten after every
part so a run cut short still leaves what it measured; a part that fails does not stop the rest:

    correctness  fp32 with TF32 off: greedy output of every drafter (draft model, prompt lookup,
                 EAGLE when this build has it), eager and compiled, against plain decoding
                 through our engine, and our plain decoding against Hugging Face generate()
    fast_path    bf16, compiled: compile time per model, whether CUDA graphs ran (inductor's
                 skip counter), the cost model's table (eager and compiled step times, c,
                 baseline tokens/s against the bandwidth ceiling, predicted speedups)
    ceiling      the engine at controlled acceptance (bench/ceiling.py) on the compiled bf16
                 target, the synthetic drafter costing the measured draft model's c
    bf16_ties    how often greedy speculative output differs from plain decoding in bf16, and
                 the logit gap where it does (ties under rounding: a 1-token step and a
                 (k+1)-token verify round differently)
    loading      the preset loader on random-weight presets saved to a local folder: bf16, draft
                 on cuda:0, target device_map="auto", an nf4 draft through bitsandbytes
    app          `python app.py` on such a preset, one message through gradio_client: time to
                 first token, tokens/s, the models panel's decode path

`--tiny` runs every part on the CPU with tiny configs in about a minute (a test in CI).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import platform
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..cli import inform, one_line
from ..engine import SpeculativeEngine
from ..decoding.eager import CachedModel
from ..sampling import SamplingParams
from .machine import load_average

PASS, FAIL, NOT_RUN = "pass", "fail", "not run"
PARTS = ("correctness", "fast_path", "ceiling", "bf16_ties", "loading", "eagle_cost", "app")


@dataclass(frozen=True)
class Scale:
    """Shapes and sizes of one run of the check."""

    device: str
    target: str  # an architecture of cost_model.ARCHITECTURES
    draft: str
    prompts: int = 3
    prompt_tokens: int = 96
    new_tokens: int = 48
    draft_layers: int = 2  # the correctness draft: the target's first layers (agrees often)
    loading_target: str = "qwen2.5-0.5b"  # saved to disk for the loading and app parts
    eagle_target: str = "llama-3.1-8b"  # the EAGLE-3 head's c is measured over this target
    eagle_draft: str = "llama-3.2-1b"
    ceiling_acceptances: tuple = (0.6, 0.8, 0.9)
    ceiling_tokens: int = 96
    cost_repeats: int = 20
    context: int = 256
    backend: str = "inductor"  # torch.compile's; TINY only traces the steps ("eager"): CI has no time for codegen


FULL = Scale(device="cuda", target="qwen2.5-7b", draft="qwen2.5-0.5b")
TINY = Scale(device="cpu", target="tiny", draft="tiny-draft", prompts=2, prompt_tokens=16, new_tokens=16,
             draft_layers=1, loading_target="tiny", eagle_target="tiny", eagle_draft="tiny-draft", ceiling_acceptances=(0.8,), ceiling_tokens=16, cost_repeats=2,
             context=16, backend="eager")


@dataclass
class Check:
    name: str
    status: str
    detail: str = ""


@dataclass
class Part:
    name: str
    status: str = NOT_RUN
    reason: str = ""
    seconds: float = 0.0
    checks: list[Check] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def check(self, name: str, ok: bool | None, detail: str = "") -> bool:
        """Record one check: True pass, False fail, None not run."""
        self.checks.append(Check(name, NOT_RUN if ok is None else PASS if ok else FAIL, detail))
        return bool(ok)


# ---------------------------------------------------------------- the command


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    scale = TINY if args.tiny else FULL
    if args.device:
        scale = replace(scale, device=args.device)
    wanted = [p.strip() for p in args.parts.split(",") if p.strip()] if args.parts else list(PARTS)
    unknown = [p for p in wanted if p not in PARTS]
    if unknown:
        print(f"error: unknown parts {', '.join(unknown)}; parts: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    if scale.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA device here: run it on a GPU machine, or pass --tiny (CPU, tiny configs)",
              file=sys.stderr)
        return 2
    if not scale.device.startswith("cuda"):
        torch.set_num_threads(1)  # small models on a shared CPU: one thread is faster than contending ones
    report = run_check(scale, wanted, Path(args.out))
    inform(f"wrote {Path(args.out) / 'gpu_check.json'} and gpu_check.md")
    return 0 if all(p["status"] != FAIL for p in report["parts"]) else 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdec_core.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    p.add_argument("--tiny", action="store_true", help="tiny configs on the CPU (about a minute; the CI test)")
    p.add_argument("--parts", help=f"comma-separated, from {','.join(PARTS)} (default: all)")
    p.add_argument("--device", help="cuda (default), cuda:N, or cpu")
    return p


def run_check(scale: Scale, parts: list[str], out: Path) -> dict:
    """Run the parts in order, writing the report after each; returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    report = {"command": "python -m specdec_core.gpu_check " + " ".join(sys.argv[1:]), "scale": scale.__dict__,
              "environment": environment(scale.device), "parts": [], "total_s": 0.0}
    started = time.perf_counter()
    shared: dict = {}  # models and compiled steps the later parts reuse
    for name in parts:
        part = Part(name)
        inform(f"gpu_check: {name} ...")
        t0 = time.perf_counter()
        try:
            reason = PART_FUNCTIONS[name](scale, part, shared, out)
            if reason:  # a package or a piece of this build is missing
                part.status, part.reason = NOT_RUN, reason
            else:
                part.status = FAIL if any(c.status == FAIL for c in part.checks) else PASS
        except Exception as error:  # noqa: BLE001 - a failing part is recorded; the rest still runs
            part.status, part.reason = FAIL, one_line(error)[:500]
            part.data["traceback"] = traceback.format_exc(limit=8)[-3000:]
        part.seconds = round(time.perf_counter() - t0, 1)
        inform(f"gpu_check: {name}: {part.status} in {part.seconds:.0f} s {part.reason}")
        report["parts"].append(_part_dict(part))
        report["total_s"] = round(time.perf_counter() - started, 1)
        _write(out, report)
    _free(shared)
    return report


# ---------------------------------------------------------------- the environment


def environment(device: str) -> dict:
    env = {"python": platform.python_version(), "platform": platform.platform(), "load_average": load_average()}
    for package in ("torch", "transformers", "accelerate", "bitsandbytes", "gradio", "gradio_client", "triton",
                    "safetensors", "tokenizers", "huggingface_hub"):
        try:
            env[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            env[package] = None
    env["cuda"] = torch.version.cuda
    if device.startswith("cuda") and torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(torch.device(device))
        env["gpu"] = properties.name
        env["gpu_memory_gb"] = round(properties.total_memory / 1e9, 1)
        env["capability"] = f"{properties.major}.{properties.minor}"
    else:
        env["gpu"] = None
    from ..decoding.eager import cache_kwargs

    env["cache_keyword"] = next(iter(cache_kwargs(_tiny_probe_model(), None)))
    return env


def _tiny_probe_model():
    from .cost_model import ARCHITECTURES, build_model

    return build_model(ARCHITECTURES["tiny"], torch.float32, torch.device("cpu"))


# ---------------------------------------------------------------- models and helpers


class _NumberTokenizer:
    """Random-weight models need no text: ids decode to numbers and nothing ends a reply."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f" {int(i)}" for i in ids)


def _build(name: str, dtype: torch.dtype, device: str, seed: int, layers: int | None = None):
    from .cost_model import build_model, load_architecture

    config = load_architecture(name)
    if layers is not None:
        config["num_hidden_layers"] = layers
    torch.manual_seed(seed)
    model = build_model(config, dtype, torch.device(device))
    model.generation_config.eos_token_id = None  # random weights: run every reply to its length
    return model


def _shallow_copy(target, layers: int):
    """A draft that agrees with a random target often: its embedding, first layers and head."""
    import copy

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    with torch.device(target.device):
        draft = type(target)(config).to(target.dtype)
    draft.load_state_dict(target.state_dict(), strict=False)  # the deeper layers are left out
    draft.generation_config.eos_token_id = None
    return draft.eval()


def _prompts(vocab: int, count: int, length: int, seed: int = 5) -> list[list[int]]:
    """Random prompts that repeat a phrase, so prompt lookup has something to copy."""
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(count):
        phrase = torch.randint(0, vocab, (max(length // 4, 4),), generator=generator).tolist()
        noise = torch.randint(0, vocab, (length,), generator=generator).tolist()
        prompts.append((noise[: length // 2] + phrase + noise[length // 2 :] + phrase)[:length])
    return prompts


def _engine(target, drafter=None, make_runner=CachedModel, k: int = 4) -> SpeculativeEngine:
    return SpeculativeEngine(target, _NumberTokenizer(), drafter=drafter, draft_length=k, adaptive=False,
                             make_runner=make_runner)


def _greedy(engine: SpeculativeEngine, prompt: list[int], tokens: int) -> tuple[list[int], object]:
    engine.forget()
    result = engine.generate(prompt, SamplingParams(max_new_tokens=tokens))
    return result.token_ids, result.stats


def _hf_greedy(model, prompt: list[int], tokens: int) -> list[int]:
    from transformers import GenerationConfig

    ids = torch.tensor([prompt], device=model.device)
    config = GenerationConfig(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, num_beams=1,
                              eos_token_id=None, pad_token_id=0, use_cache=True)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, len(prompt):].tolist()


def _drafters(target, draft, make_draft_runner=CachedModel) -> dict[str, object]:
    """Every drafter this build has, by name (EAGLE only when its drafter exists)."""
    from ..drafters import ModelDrafter, PromptLookupDrafter

    drafters = {"model": ModelDrafter(draft, make_runner=make_draft_runner), "prompt_lookup": PromptLookupDrafter()}
    eagle = _eagle_drafter(target)
    if eagle is not None:
        drafters["eagle"] = eagle
    return drafters


def _eagle_drafter(target):
    """An EAGLE-3 drafter with a random head of the target's shape, if this build has one."""
    from .. import drafters

    make = getattr(drafters, "EagleDrafter", None)
    if make is None:
        return None
    head = drafters.Eagle3Head.random(target.config, dtype=target.dtype).to(target.device)
    return make(head)


@contextlib.contextmanager
def _tf32_off():
    """fp32 matmuls in full precision (TF32 would make fp32 round like a lower precision)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def _free(shared: dict) -> None:
    import gc

    shared.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"].get("cudagraph_skips", 0))


# ---------------------------------------------------------------- the parts


def part_correctness(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """fp32, TF32 off: every drafter, eager and compiled, gives plain decoding's tokens."""
    from ..decoding.static import DRAFT_STEP_SIZES, StaticSteps

    with _tf32_off():
        target = _build(scale.target, torch.float32, scale.device, seed=0)
        draft = _shallow_copy(target, scale.draft_layers)
        prompts = _prompts(target.config.vocab_size, scale.prompts, scale.prompt_tokens)
        n = scale.new_tokens
        plain = [_greedy(_engine(target), p, n)[0] for p in prompts]
        hf = [_hf_greedy(target, p, n) for p in prompts]
        part.check("ours-baseline == HF generate (eager, fp32)", hf == plain,
                   f"{sum(a == b for a, b in zip(hf, plain))}/{len(prompts)} prompts identical")
        compiled_steps = {}
        t0 = time.perf_counter()
        # Two target shapes (1 and 9, a verify of 1 + 4 padded up) and the draft's two keep compiling short.
        compiled_steps["target"] = StaticSteps(target, step_sizes=(1, 9), progress=False, name="target fp32",
                                               backend=scale.backend)
        compiled_steps["draft"] = StaticSteps(draft, step_sizes=DRAFT_STEP_SIZES, progress=False, name="draft fp32",
                                              backend=scale.backend)
        part.data["compile_s"] = round(time.perf_counter() - t0, 1)
        part.data["compiled"] = {role: s.decode_path + (f" ({s.fallback_reason})" if s.fallback_reason else "")
                                 for role, s in compiled_steps.items()}
        part.check("fp32 steps compiled", all(s.fallback_reason is None for s in compiled_steps.values()),
                   "; ".join(f"{r}: {p}" for r, p in part.data["compiled"].items()))
        compiled_plain = [_greedy(_engine(target, make_runner=compiled_steps["target"]), p, n)[0] for p in prompts]
        part.check("compiled ours-baseline == eager ours-baseline (fp32)", compiled_plain == plain,
                   f"{sum(a == b for a, b in zip(compiled_plain, plain))}/{len(prompts)} prompts identical")
        acceptance = {}
        for path, target_runner, draft_runner in (("eager", CachedModel, CachedModel),
                                                  ("compiled", compiled_steps["target"], compiled_steps["draft"])):
            for name, drafter in _drafters(target, draft, draft_runner).items():
                engine = _engine(target, drafter, make_runner=target_runner)
                same, drafted, accepted = 0, 0, 0
                for p, expected in zip(prompts, plain):
                    tokens, stats = _greedy(engine, p, n)
                    same += tokens == expected
                    drafted, accepted = drafted + stats.drafted_tokens, accepted + stats.accepted_tokens
                acceptance[f"{name} {path}"] = round(accepted / drafted, 3) if drafted else None
                part.check(f"{name}, {path}: greedy == ours-baseline (fp32)", same == len(prompts),
                           f"{same}/{len(prompts)} prompts identical, acceptance {acceptance[f'{name} {path}']}")
        if _eagle_drafter_missing():
            part.check("eagle: greedy == ours-baseline (fp32)", None, "EagleDrafter is not in this build")
        part.data["acceptance"] = acceptance
    del target, draft, compiled_steps
    _free({})
    return None


def _eagle_drafter_missing() -> bool:
    from .. import drafters

    return not hasattr(drafters, "EagleDrafter")


def part_fast_path(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """bf16 compiled: compile time, CUDA graphs, the cost model's table."""
    from .cost_model import markdown_table, run_cost_model

    dtype = torch.bfloat16
    models = {"target": _build(scale.target, dtype, scale.device, seed=0),
              "draft": _build(scale.draft, dtype, scale.device, seed=1)}
    runners: dict = {}
    if scale.backend != "inductor":  # the app's steps, traced only (see Scale.backend)
        from ..decoding.static import DEFAULT_STEP_SIZES, DRAFT_STEP_SIZES, StaticSteps

        for role, sizes in (("target", DEFAULT_STEP_SIZES), ("draft", DRAFT_STEP_SIZES)):
            runners[role] = StaticSteps(models[role], step_sizes=sizes, progress=False, name=role, backend=scale.backend)
    skips = _cudagraph_skips()
    result = run_cost_model(scale.target, scale.draft, device=scale.device, dtype="bfloat16", context=scale.context,
                            repeats=scale.cost_repeats, modes=("eager", "compiled"), progress=False, built=models,
                            runners=runners, bandwidth_gbs=None if scale.device.startswith("cuda") else 10.0,
                            eagle=True)
    skipped = _cudagraph_skips() - skips
    compiled = result["modes"]["compiled"]
    part.data["cost_model"] = result
    part.data["cost_model_table"] = markdown_table(result)
    (out / "cost_model.md").write_text(part.data["cost_model_table"] + "\n")
    part.check("target and draft steps compiled", not any(compiled["fallback"].values()),
               f"compile ({scale.backend}): target {runners['target'].warmup_s:.1f} s, draft "
               f"{runners['draft'].warmup_s:.1f} s (step sizes {runners['target'].step_sizes} and "
               f"{runners['draft'].step_sizes})")
    part.data["compile_s"] = {role: round(r.warmup_s, 1) for role, r in runners.items()}
    cuda = scale.device.startswith("cuda")
    part.check("CUDA graphs in use (inductor skipped none)", skipped == 0 if cuda else None,
               f"cudagraph skips: {skipped}" if cuda else "CPU: no CUDA graphs")
    fraction, c = compiled["bandwidth_fraction"], compiled["c"]
    part.check("compiled baseline >= 60% of the bandwidth ceiling", fraction >= 0.6 if cuda else None,
               f"{fraction:.0%} ({compiled['baseline_tokens_per_s']} of {compiled['bandwidth_ceiling_tokens_per_s']} tok/s)")
    part.check("c <= 0.2 (compiled draft step / target step)", c <= 0.2 if cuda else None, f"c = {c}")
    head = result["eagle"]["modes"]["compiled"]
    part.check("EAGLE-3 head of the target's shape timed", True,
               f"{result['eagle']['step_ms']} ms a step (eager), c = {head['c']} of a compiled target step")
    shared.update(models=models, runners=runners, c=c)
    return None


def part_eagle_cost(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """The cost model over the EAGLE-3 target (Llama-3.1-8B shapes), with a head of its shape."""
    from .cost_model import markdown_table, run_cost_model

    shared.pop("models", None), shared.pop("runners", None), shared.pop("ceiling_subject", None)
    _free({})
    cuda = scale.device.startswith("cuda")
    modes = ("eager", "compiled") if scale.backend == "inductor" else ("eager",)  # TINY: no codegen
    result = run_cost_model(scale.eagle_target, scale.eagle_draft, device=scale.device, dtype="bfloat16",
                            context=scale.context, repeats=scale.cost_repeats, modes=modes,
                            progress=False, bandwidth_gbs=None if cuda else 10.0, eagle=True)
    part.data["cost_model"] = result
    table = markdown_table(result)
    (out / "cost_model_eagle.md").write_text(table + "\n")
    head = result["eagle"]
    mode = modes[-1]
    part.check(f"EAGLE-3 head's c over the {mode} target", True,
               f"head {head['step_ms']} ms (eager, {head['parameters']} params), c = {head['modes'][mode]['c']} "
               f"(the draft model's c = {result['modes'][mode]['c']})")
    return None


def part_ceiling(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """The ceiling on the compiled bf16 target, drafting at the draft model's measured c."""
    from . import ceiling

    if "models" not in shared:
        return "needs the fast_path part (its compiled target and measured c)"
    target = shared["models"]["target"]
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, target.config.vocab_size, (scale.prompt_tokens,), generator=generator).tolist()
               for _ in range(max(scale.prompts - 1, 1))]
    subject = ceiling.Subject(target, _NumberTokenizer(), prompts, shared["runners"]["target"],
                              {"architecture": scale.target, "dtype": "bfloat16", "device": scale.device,
                               "decode_path": shared["runners"]["target"].decode_path})
    results = {}
    for label, c in (("free drafter", 0.0), ("draft model's c", shared["c"])):
        result = ceiling.run_ceiling(subject, acceptances=scale.ceiling_acceptances, draft_lengths=(4,), adaptive=True,
                                     draft_cost=c, max_new_tokens=scale.ceiling_tokens, progress=False)
        results[label] = result
        (out / f"ceiling_{'free' if c == 0 else 'c'}.md").write_text(ceiling.markdown(result) + "\n")
    part.data["ceiling"] = results
    at = min(scale.ceiling_acceptances, key=lambda a: abs(a - 0.8))
    best = max((r for r in results["draft model's c"]["results"] if r["acceptance"] == at), key=lambda r: r["speedup"])
    cuda = scale.device.startswith("cuda")
    part.check(f"ceiling speedup >= 2.0x at a = {at:g} with the draft model's c", best["speedup"] >= 2.0 if cuda else None,
               f"{best['speedup']}x ({best['setting']}, predicted {best['predicted_speedup']}x, c = {best['c']})")
    shared["ceiling_subject"] = subject
    return None


def part_bf16_ties(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """bf16: how often greedy speculative output differs from plain decoding, and by how much the
    two tokens' logits differ where it does (a tie under rounding is a gap near bf16's precision)."""
    from ..drafters import PromptLookupDrafter
    from .synthetic import SyntheticDrafter

    if "models" not in shared:
        return "needs the fast_path part (its bf16 models)"
    target, runner = shared["models"]["target"], shared["runners"]["target"]
    prompts = _prompts(target.config.vocab_size, scale.prompts * 2, scale.prompt_tokens, seed=9)
    n = scale.new_tokens
    plain = [_greedy(_engine(target, make_runner=runner), p, n)[0] for p in prompts]
    rows = {}
    for name, make in (("prompt_lookup", PromptLookupDrafter), ("synthetic a=0.8", lambda: SyntheticDrafter(0.8))):
        drafter = make()
        engine = _engine(target, drafter, make_runner=runner)
        diverged = []
        for i, (p, expected) in enumerate(zip(prompts, plain)):
            if isinstance(drafter, SyntheticDrafter):
                drafter.set_reference(p + expected, seed=i)
            tokens, _ = _greedy(engine, p, n)
            if tokens != expected:
                at = next(j for j, (a, b) in enumerate(zip(tokens, expected)) if a != b)
                diverged.append({"prompt": i, "position": at,
                                 "logit_gap": _logit_gap(target, p + expected[:at], tokens[at], expected[at])})
        rows[name] = {"runs": len(prompts), "diverged": len(diverged), "where": diverged}
        part.check(f"{name}: bf16 greedy divergence reported", True,
                   f"{len(diverged)}/{len(prompts)} replies differ"
                   + (": logit gaps " + ", ".join(f"{d['logit_gap']:.3g}" for d in diverged) if diverged else ""))
    part.data["bf16"] = rows
    return None


def _logit_gap(model, prefix: list[int], a: int, b: int) -> float:
    """|logit(a) - logit(b)| for the next token after `prefix`, from one uncached forward."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prefix], device=model.device)).logits[0, -1].float()
    return abs(float(logits[a] - logits[b]))


PRESETS = """\
# Random-weight presets written by python -m specdec_core.gpu_check (its loading and app parts).
auto_fallback: check-bf16
presets:
  check-bf16:
    description: random-weight target and draft, bf16, draft on the first GPU
    target: ./target
    draft: ./draft
    dtype: {dtype}
    draft_quantization: none
    drafter: model
    draft_length: 4
    memory_gb: 4
    requires_gpu: {gpu}
    compile: false
  check-nf4:
    description: the same pair with an nf4 draft through bitsandbytes
    target: ./target
    draft: ./draft
    dtype: {dtype}
    draft_quantization: 4bit
    drafter: model
    draft_length: 4
    memory_gb: 4
    requires_gpu: {gpu}
    compile: false
  check-compiled:
    description: the same pair, compiled steps (the app part)
    target: ./target
    draft: ./draft
    dtype: {dtype}
    draft_quantization: none
    drafter: model
    draft_length: 4
    memory_gb: 4
    requires_gpu: {gpu}
    compile: true
"""


def write_presets(scale: Scale, folder: Path) -> Path:
    """Random-weight target and draft (save_pretrained) with a word-level tokenizer, and a
    models.yaml naming them; returns the models.yaml."""
    folder.mkdir(parents=True, exist_ok=True)
    cuda = scale.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    target = _build(scale.loading_target, dtype, "cpu", seed=3)
    draft = _shallow_copy(target, 1)
    tokenizer = word_tokenizer(target.config.vocab_size)
    for name, model in (("target", target), ("draft", draft)):
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
    config = folder / "models.yaml"
    config.write_text(PRESETS.format(dtype="bfloat16" if cuda else "float32", gpu="true" if cuda else "false"))
    return config


def word_tokenizer(vocab: int):
    """A tokenizer with no download: `w0 w1 ...` words, ChatML special tokens and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    words = {token: i for i, token in enumerate(specials)}
    words.update({f"w{i}": i for i in range(len(specials), vocab)})
    core = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<|im_end|>",
                                        pad_token="<unk>", bos_token="<|im_start|>")
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    return tokenizer


def part_loading(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """The preset loader on random-weight presets in a local folder."""
    import tempfile

    from ..presets.loaded import unload
    from ..presets.loading import load_preset

    folder = Path(tempfile.mkdtemp(prefix="gpu_check_presets_"))
    config = write_presets(scale, folder)
    shared["presets"] = config
    cuda = scale.device.startswith("cuda")
    models = load_preset("check-bf16", str(config), compile=False)
    try:
        target_map = getattr(models.target, "hf_device_map", None)
        part.data["check-bf16"] = {"describe": models.describe(), "notes": models.notes, "target_device_map": str(target_map)}
        want = torch.bfloat16 if cuda else torch.float32
        part.check(f"weights load as {str(want).removeprefix('torch.')}",
                   models.target.dtype == want and models.draft.dtype == want,
                   f"target {models.target.dtype}, draft {models.draft.dtype}")
        part.check("draft on cuda:0", str(models.draft.device) == "cuda:0" if cuda else None, str(models.draft.device))
        part.check('target placed by device_map="auto"', bool(target_map) if cuda else None, str(target_map))
        plain = models.make_engine(drafter="none").generate([5, 6, 7, 8], SamplingParams(max_new_tokens=12))
        spec = models.make_engine(drafter="model", adaptive=False).generate([5, 6, 7, 8], SamplingParams(max_new_tokens=12))
        part.check("the loaded pair decodes", plain.stats.new_tokens > 0 and spec.stats.new_tokens > 0,
                   f"identical to plain decoding: {spec.token_ids == plain.token_ids} (bf16 may differ at a tie)")
    finally:
        unload(models)
    if importlib.util.find_spec("bitsandbytes") is None:
        part.check("nf4 draft through bitsandbytes", None, "bitsandbytes is not installed here")
    else:
        quantized = load_preset("check-nf4", str(config), compile=False)
        try:
            info = [i for i in quantized.info if i.role == "draft"][0]
            part.check("nf4 draft through bitsandbytes", "nf4" in str(info.quantization).lower() or "4" in str(info.quantization),
                       f"{info.line()}; notes: {'; '.join(quantized.notes) or 'none'}")
            reply = quantized.make_engine(drafter="model").generate([5, 6, 7, 8], SamplingParams(max_new_tokens=8))
            part.check("the nf4 pair decodes", reply.stats.new_tokens > 0, f"{reply.stats.new_tokens} tokens")
        finally:
            unload(quantized)
    return None


def part_app(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """`python app.py` on the compiled random-weight preset; one message through gradio_client."""
    missing = [m for m in ("gradio", "gradio_client") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed here"
    app_py = Path(__file__).resolve().parents[2] / "app.py"
    if not app_py.exists():
        return f"{app_py} not found (the app is not part of this install)"
    import tempfile

    config = shared.get("presets") or write_presets(scale, Path(tempfile.mkdtemp(prefix="gpu_check_app_")))
    cuda = scale.device.startswith("cuda")
    # On a CPU the app decodes eagerly (compiling there takes minutes): the check then only
    # says which path the panel shows.
    preset = "check-compiled" if cuda else "check-bf16"
    return run_app(app_py, config, preset, part, timeout_s=540 if cuda else 180, expect_compiled=cuda)


def run_app(app_py: Path, config: Path, preset: str, part: Part, timeout_s: float, expect_compiled: bool) -> str | None:
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(part_log := Path(config).parent / "app.log", "w")
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, str(app_py), "--config", str(config), "--preset", preset,
                               "--port", str(port), "--max-new-tokens", "24"], stdout=log, stderr=subprocess.STDOUT)
    try:
        client = _connect(f"http://127.0.0.1:{port}/", server, started + timeout_s)
        part.data["app_start_s"] = round(time.perf_counter() - started, 1)
        sent = time.perf_counter()
        outputs = client.predict("w10 w11 w12 w13", api_name="/send")
        part.data["reply_s"] = round(time.perf_counter() - sent, 1)
        text = json.dumps(outputs, default=str)
        part.data["outputs_tail"] = text[-2000:]
        part.check("a reply came back", "tok tok-" in text, f"reply in {part.data['reply_s']} s")
        decode = re.findall(r"decode: [a-z ,]+", text)
        part.check("models panel says decode: compiled", "decode: compiled" in text if expect_compiled else None,
                   "; ".join(dict.fromkeys(decode)) or "no decode line")
        for name in ("Time to first token", "Tokens/s"):
            part.data[name] = _panel_value(text, name)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        part.data["app_log_tail"] = part_log.read_text()[-2000:]
    return None


def _connect(url: str, server, deadline: float):
    from gradio_client import Client

    while True:
        if server.poll() is not None:
            raise RuntimeError(f"app.py exited with {server.returncode} before serving")
        try:
            return Client(url, verbose=False)
        except Exception:  # noqa: BLE001 - not up yet
            if time.perf_counter() > deadline:
                raise TimeoutError("app.py did not serve in time") from None
            time.sleep(2)


def _panel_value(text: str, name: str) -> str | None:
    """A figure of the live panel's table (`| name | value |`) in the app's outputs."""
    found = re.search(rf"\| {re.escape(name)} \| ([^|]+?) \|", text)
    return found.group(1) if found else None


PART_FUNCTIONS: dict[str, Callable] = {
    "correctness": part_correctness,
    "fast_path": part_fast_path,
    "ceiling": part_ceiling,
    "bf16_ties": part_bf16_ties,
    "loading": part_loading,
    "eagle_cost": part_eagle_cost,
    "app": part_app,
}


# ---------------------------------------------------------------- the report


def _part_dict(part: Part) -> dict:
    return {"name": part.name, "status": part.status, "reason": part.reason, "seconds": part.seconds,
            "checks": [c.__dict__ for c in part.checks], "data": _jsonable(part.data)}


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


def _write(out: Path, report: dict) -> None:
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gpu_check.md").write_text(markdown(report) + "\n")


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"# GPU check on {env.get('gpu') or 'CPU'}",
        "",
        f"torch {env['torch']} (CUDA {env['cuda']}), transformers {env['transformers']}, bitsandbytes "
        f"{env['bitsandbytes']}, gradio {env['gradio']}; cache keyword `{env['cache_keyword']}`; "
        f"load average {env['load_average']}; {report['total_s']:.0f} s in all.",
        "",
        "| part | status | seconds | reason |",
        "|---|---|---|---|",
    ]
    lines += [f"| {p['name']} | {p['status']} | {p['seconds']:.0f} | {p['reason']} |" for p in report["parts"]]
    for p in report["parts"]:
        if not p["checks"]:
            continue
        lines += ["", f"## {p['name']}", "", "| check | status | detail |", "|---|---|---|"]
        lines += [f"| {c['name']} | {c['status']} | {c['detail']} |" for c in p["checks"]]
        if p["name"] == "fast_path" and "cost_model_table" in p["data"]:
            lines += ["", p["data"]["cost_model_table"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
