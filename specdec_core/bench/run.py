"""Benchmark: our engine against Hugging Face generate, assisted generation and prompt lookup.

    python -m specdec_core.bench [run] --preset NAME [--config PATH] [--questions PATH]
        [--categories a,b] [--limit N] [--max-new-tokens N] [--repeats N]
        [--methods ours-baseline,ours-model,ours-lookup,ours-eagle,ours-hybrid,ours-medusa,hf-generate,hf-assisted,hf-lookup]
        [--temperature T] [--out DIR] [--vllm-python PATH] [--vllm-servers vllm=URL,...]

Flags and outputs are a contract (issue 5). Every method gets the same chat-template prompt and
the same max_new_tokens; methods are interleaved per question (their order rotates, so machine
drift hits all alike); each question is warmed up once per method, then the median of
--repeats timed runs is kept. Greedy runs check that every method's output equals
ours-baseline's: a mismatch of one of our methods is a bug and the command exits with 1 (after
writing the results); a mismatch of a Hugging Face method is reported only. Bad flags, presets
or files exit with 2 and a one-line error. The flags are read in cli.py.

Outputs in DIR: results.json, results.md, speedup.png, acceptance.png (and vllm-*.log, the logs
of the vLLM servers the bench started).
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .methods import (
    LLAMACPP,
    METHODS,
    NEEDS_DRAFT_MODEL,
    NEEDS_EAGLE_HEAD,
    NEEDS_MEDUSA_HEADS,
    NEEDS_RETRIEVAL,
    VLLM_METHODS,
    VllmOptions,
    available_methods,
    close_methods,
    llamacpp_problem,
    make_methods,
    timed_run,
)
from .vllm_server import parse_servers, vllm_python
from ..presets.config import GGUF_KINDS
from .questions import DEFAULT_QUESTIONS, Question, load_questions
from .runs import Run
from ..cli import EXIT_ERROR, inform  # noqa: F401  (EXIT_ERROR: an exit code)
from .machine import (bandwidth_ceiling, gguf_bytes_per_step, load_average, machine, model_device,
                      safetensors_bytes_per_step, versions)

EXIT_MISMATCH = 1
DEFAULT_OUT = "bench_out"  # git-ignored
MAX_PROBED_DRAFT = 20  # verify steps are probed for draft lengths up to this


def run(args: argparse.Namespace, command: str = "") -> int:
    from ..chat import chat_prompt_ids
    from ..presets.loading import load_preset
    from ..sampling import SamplingParams

    out = Path(args.out)
    vllm = VllmOptions(vllm_python(args.vllm_python), parse_servers(args.vllm_servers), out)
    methods = _methods(args.methods) if args.methods else list(available_methods(vllm))
    if not args.methods and LLAMACPP not in methods:
        inform(f"{llamacpp_problem()}: not compared")
    if LLAMACPP in methods and llamacpp_problem():
        raise ValueError(llamacpp_problem())
    _check_vllm(methods, vllm, explicit=bool(args.methods))
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    if args.warmup_tokens < 0:
        raise ValueError(f"--warmup-tokens must be 0 or more, got {args.warmup_tokens}")
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    questions = load_questions(args.questions, categories, args.limit)
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    out.mkdir(parents=True, exist_ok=True)

    _quiet_transformers()
    if args.threads is not None:
        import torch

        if args.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    load_before = load_average()
    started = time.perf_counter()
    models = load_preset(args.preset, args.config, load_draft=any(m in NEEDS_DRAFT_MODEL for m in methods),
                         cpu_weights=args.cpu_weights, compile=args.compile)
    inform(f"preset: {models.preset.name}", *models.notes)
    if not models.wait_for_compiling(0):  # measure the path the preset keeps, not its first minutes
        inform("waiting for the background compile before measuring ...")
        models.wait_for_compiling()
    inform(models.describe())
    if args.methods is None and models.eagle_head is None:
        methods = [m for m in methods if m not in NEEDS_EAGLE_HEAD]
        inform(f"no EAGLE head loaded: leaving out {', '.join(NEEDS_EAGLE_HEAD)}")
    if args.methods is None and models.medusa_heads is None:
        methods = [m for m in methods if m not in NEEDS_MEDUSA_HEADS]
        inform(f"no Medusa heads loaded: leaving out {', '.join(NEEDS_MEDUSA_HEADS)}")
    if args.methods is None and models.preset.retrieval is None:
        methods = [m for m in methods if m not in NEEDS_RETRIEVAL]
        inform(f"no retrieval datastore in the preset: leaving out {', '.join(NEEDS_RETRIEVAL)}")
    if args.methods is None and LLAMACPP in methods and models.preset.target.kind not in GGUF_KINDS:
        methods = [m for m in methods if m != LLAMACPP]
        inform(f"llamacpp: the target {models.preset.target.label} is not a GGUF file: not compared")
    if any(m in VLLM_METHODS for m in methods):
        inform("starting vLLM servers (minutes) ...")
    with _exit_on_sigterm():  # a timeout's or kill's SIGTERM runs the finally: the servers stop
        bench_methods = make_methods(methods, models, threads=args.threads, vllm=vllm)
        try:
            calibration = layer_skip_calibration(bench_methods)  # made (calibrated) with its engine
            if calibration:
                inform(calibration["line"])
            prompts = {q.question_id: chat_prompt_ids(models.tokenizer, _conversation(q)) for q in questions}
            runs = measure(questions, prompts, bench_methods, params, args.repeats, args.warmup_tokens, args.seed)
        finally:
            close_methods(bench_methods)  # the vLLM servers the bench started stop here
    served = {m.name: m.describe() for m in bench_methods if hasattr(m, "describe")}
    for name, about in served.items():
        if about["prompt_tokens_differ"]:
            inform(f"{name}: the server's chat template made prompts of another length than ours "
                   f"({about['prompt_tokens_differ'][0]}): it read other prompts")

    from .outputs import write_json
    from .report import plot_acceptance, plot_speedup, summarize, write_markdown
    from .theory_check import probe_all

    inform("probing step costs ...")
    draft = models.draft  # None unless a method needs it (load_draft above)
    max_k = min(MAX_PROBED_DRAFT, max([1] + [d for rs in runs.values() for r in rs for d, _ in r.rounds]))
    costs = probe_all(models.target, draft, _representative_prompts(questions, prompts), max_k,
                      target_runner=models.target_runner, draft_runner=models.draft_runner)
    summary = summarize(questions, runs, methods, params.greedy, costs)
    overall = {m: per_family["overall"]["tokens_per_second"] for m, per_family in summary["results"].items()}
    own = {m.name: gguf_bytes_per_step(m.gguf_path) for m in bench_methods if m.name == LLAMACPP}
    own |= {m.name: safetensors_bytes_per_step(m.server.model_dir)  # a started vLLM server's bfloat16 copy
            for m in bench_methods if getattr(m, "server", None) is not None}
    bandwidth = bandwidth_ceiling(models.target, overall, own_weight_bytes=own)
    report = {
        "command": command,
        "preset": _preset_info(models),
        "models": [dataclasses.asdict(info) for info in models.info],
        "loaded": models.describe().splitlines() + models.notes,  # decode paths, compile times, fallbacks
        "device": model_device(models.target),
        "machine": machine(load_before),
        "versions": versions(),
        "settings": {
            "methods": methods,
            "questions_file": str(args.questions) if args.questions else _display(DEFAULT_QUESTIONS),
            "questions": len(questions),
            "categories": categories,
            "limit_per_category": args.limit,
            "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats,
            "warmup_tokens": min(args.warmup_tokens, args.max_new_tokens),
            "temperature": args.temperature,
            "seed": args.seed if not params.greedy else None,
            "hf": _hf_settings(bench_methods, params),
            "elapsed_s": time.perf_counter() - started,
        },
        **summary,
        "step_costs": {family: c.as_dict() for family, c in costs.items()},
        "layer_skip_calibration": calibration,
        "bandwidth": bandwidth,
        "per_question": _per_question(questions, prompts, runs, methods, summary["identity"]),
        "served": served,  # the servers the vllm methods asked (URL, model, the command that started one)
    }
    write_json(out / "results.json", report)
    write_markdown(out / "results.md", report)
    plot_speedup(out / "speedup.png", report)
    plot_acceptance(out / "acceptance.png", report)
    inform(*_closing_lines(report, out))
    mismatched = [m for m, v in summary["identity"].items() if v and m.startswith("ours-") and v["mismatched_questions"]]
    if mismatched:
        for m in mismatched:
            print(f"error: {m} differs from ours-baseline on questions "
                  f"{', '.join(summary['identity'][m]['mismatched_questions'])} (greedy must be identical)",
                  file=sys.stderr)
        return EXIT_MISMATCH
    return 0


def layer_skip_calibration(bench_methods) -> dict | None:
    """What ours-layer-skip's drafter chose at its calibration (layers, acceptance, cost), or None."""
    for method in bench_methods:
        calibration = getattr(getattr(getattr(method, "engine", None), "drafter", None), "calibration", None)
        if calibration is not None:
            return calibration.as_dict()
    return None


def measure(
    questions: list[Question], prompts: dict, methods: list, params, repeats: int, warmup_tokens: int, seed: int = 0
) -> dict[tuple[str, str], list[Run]]:
    """Timed runs per (question id, method name). Methods are interleaved per question and their
    order rotates with the question and the repeat; each question is warmed up once per method."""
    from tqdm import tqdm

    warmup = dataclasses.replace(params, max_new_tokens=min(warmup_tokens, params.max_new_tokens) or 1)
    runs: dict[tuple[str, str], list[Run]] = {(q.question_id, m.name): [] for q in questions for m in methods}
    total = len(questions) * len(methods) * (repeats + (1 if warmup_tokens else 0))
    with tqdm(total=total, desc="bench", unit="run", file=sys.stderr, dynamic_ncols=True) as bar:
        for qi, q in enumerate(questions):
            ids = prompts[q.question_id]
            order = _rotated(methods, qi)
            messages = _conversation(q)  # what a served method sends; ids are our template's of it
            if warmup_tokens:
                for method in order:
                    bar.set_postfix_str(f"{q.family} warm-up {method.name}", refresh=False)
                    timed_run(method, ids, warmup, messages)
                    bar.update(1)
            for r in range(repeats):
                run_params = params if params.greedy else dataclasses.replace(params, seed=seed + 1000 * qi + r)
                for method in _rotated(order, r):
                    bar.set_postfix_str(f"{q.family} {method.name}", refresh=False)
                    runs[q.question_id, method.name].append(timed_run(method, ids, run_params, messages))
                    bar.update(1)
    return runs


@contextmanager
def _exit_on_sigterm() -> Iterator[None]:
    """SIGTERM raises SystemExit meanwhile (Python's default ends the process at once, skipping
    the finally blocks that stop the vLLM servers the bench started). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_now(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_now)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _conversation(question: Question) -> list[dict]:
    return [{"role": "user", "content": question.prompt}]


def _check_vllm(methods: list[str], vllm: VllmOptions, explicit: bool) -> None:
    """A vllm method named in --methods, or given a server, that can't run: a one-line error.
    Those left out of the default methods for want of vLLM: one line saying so."""
    for name in VLLM_METHODS:
        if (explicit and name in methods) or (name in vllm.servers and (name in methods or not explicit)):
            problem = vllm.problem(name)
            if problem:
                raise ValueError(problem)
    missing = [m for m in VLLM_METHODS if m not in methods]
    if not explicit and missing:
        inform(f"{vllm.problem(missing[0])}: {', '.join(missing)} not compared")


def _rotated(items: list, by: int) -> list:
    by %= max(len(items), 1)
    return items[by:] + items[:by]


def _methods(text: str) -> list[str]:
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        raise ValueError(f"unknown methods {', '.join(unknown) or '(none given)'}; methods: {', '.join(METHODS)}")
    return names


def _representative_prompts(questions: list[Question], prompts: dict) -> dict[str, list[int]]:
    """Per family, the prompt of median length: step costs grow with the context."""
    chosen = {}
    for family in dict.fromkeys(q.family for q in questions):
        members = sorted((len(prompts[q.question_id]), q.question_id) for q in questions if q.family == family)
        chosen[family] = prompts[members[(len(members) - 1) // 2][1]]
    return chosen


def _per_question(questions, prompts, runs, methods, identity) -> list[dict]:
    rows = []
    for q in questions:
        row = {"question_id": q.question_id, "category": q.category, "family": q.family,
               "prompt_tokens": len(prompts[q.question_id]), "methods": {}}
        for m in methods:
            rs = runs[q.question_id, m]
            same = identity.get(m)
            row["methods"][m] = {
                "new_tokens": rs[0].new_tokens,
                "wall_s": [r.wall_s for r in rs],
                "median_wall_s": statistics.median(r.wall_s for r in rs),
                "ttft_s": [r.ttft_s for r in rs],
                "target_forwards": len(rs[0].rounds),
                "identical_to_baseline": None if same is None else q.question_id not in same["mismatched_questions"],
            }
        rows.append(row)
    return rows


def _closing_lines(report: dict, out: Path) -> list[str]:
    lines = [f"wrote {out / 'results.json'}, results.md, speedup.png, acceptance.png"]
    for method, per_family in report["results"].items():
        overall = per_family["overall"]
        vs = overall.get("speedup_vs_hf_generate")
        lines.append(
            f"{method:>14}: {overall['tokens_per_second']:.1f} tokens/s"
            + (f", {vs:.2f}x hf-generate" if vs else "")
            + f" ({overall['decode_tokens_per_second']:.1f} after the first token)"
            + f", {overall['mean_accepted_tokens']:.2f} tokens per target forward"
        )
    for t in report["targets"]:
        lines.append(f"target {'met   ' if t['met'] else 'MISSED'} {t['target']}: {t['value']:.2f} (needs {t['threshold']})")
    return lines


# ---------------------------------------------------------------- what ran where


def _preset_info(models) -> dict:
    p = models.preset
    return {
        "name": p.name, "description": p.description, "target": p.target.label,
        "draft": p.draft.label if p.draft else None, "dtype": p.dtype, "draft_quantization": p.draft_quantization,
        "draft_length": p.draft_length, "adaptive": p.adaptive,
    }


def _hf_settings(methods: list, params) -> dict:
    from .methods import HF_ASSISTED, HF_LOOKUP_TOKENS, HFMethod

    hf = [m for m in methods if isinstance(m, HFMethod)]
    if not hf:
        return {}
    config = hf[0].generation_config(params)
    settings = {
        "generation_config": {k: getattr(config, k) for k in (
            "do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "eos_token_id", "pad_token_id")},
        "prompt_lookup_num_tokens": HF_LOOKUP_TOKENS,
    }
    assisted = [m for m in hf if m.name == HF_ASSISTED]
    if assisted:
        from transformers import GenerationConfig

        own = assisted[0].draft.generation_config
        try:  # what generate() falls back to for settings the draft's config leaves unset
            defaults = GenerationConfig()._get_default_generation_params()
        except AttributeError:
            defaults = {}
        settings["assistant"] = {
            k: getattr(own, k, None) if getattr(own, k, None) is not None else defaults.get(k)
            for k in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
        }
    return settings


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _quiet_transformers() -> None:
    """Assisted generation logs deprecation notes on every call; they would break the progress bar."""
    from transformers.utils import logging

    logging.set_verbosity_error()
