"""The bench's one command: `python -m specdec_core.bench [run | ceiling | cost-model | gpu-check] ...`.

    run         our engine against Hugging Face's decoding on Spec-Bench questions (run.py);
                the default: `python -m specdec_core.bench --preset NAME ...` is `run`
    ceiling     the engine's speedup at controlled acceptance against the theory (ceiling.py)
    cost-model  per-step costs of random-weight models, eager against compiled (cost_model.py)
    gpu-check   the GPU path checked and measured in one command (gpu_check/)

This module only reads the command line and hands the flags to the module that does the work.
Flags are a contract: each command takes today's (issue 5). Today's spellings keep working:
`python -m specdec_core.bench --ceiling ...` and `--cost-model ...`, and the entry points
`python -m specdec_core.cost_model` and `python -m specdec_core.gpu_check` (command_main).
Bad flags or files exit with 2 and a one-line error.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cli import inform, one_line, run_guarded
from ..presets.config import CPU_WEIGHTS
from . import ceiling, cost_model, gpu_check, run
from .architectures import ARCHITECTURES
from .ceiling_report import markdown as ceiling_markdown
from .ceiling_report import write as write_ceiling
from .cost_model_report import markdown_table
from .cost_model_report import write as write_cost_model
from .methods import LLAMACPP, METHODS
from .vllm_server import VLLM_METHODS, VLLM_PYTHON_ENV
from .synthetic import COST_MODES

PROG = "python -m specdec_core.bench"
# Today's spellings of two subcommands, as flags of the bench, in the order it checked them.
LEGACY_FLAGS = {"--cost-model": "cost-model", "--ceiling": "ceiling"}
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Command:
    """One subcommand: its flags, and what runs it (with the parsed flags and the command line as
    typed, which the reports record)."""

    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handle: Callable[[argparse.Namespace, str], int]


def main(argv: list[str] | None = None) -> int:
    """`python -m specdec_core.bench ...`: a subcommand, today's --cost-model / --ceiling, or `run`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(_with_command(argv))
    return run_guarded(lambda: args.handle(args, f"{PROG} {shlex.join(argv)}"))


def command_main(name: str, argv: list[str] | None = None, prog: str | None = None) -> int:
    """One subcommand on its own, as an entry point of its own runs it (`python -m specdec_core.gpu_check`)."""
    command = COMMANDS[name]
    argv = [a for a in (sys.argv[1:] if argv is None else argv) if LEGACY_FLAGS.get(a) != name]
    prog = prog or f"{PROG} {name}"
    parser = argparse.ArgumentParser(prog=prog, description=command.description)
    command.add_arguments(parser)
    args = parser.parse_args(argv)
    return run_guarded(lambda: command.handle(args, f"{prog} {shlex.join(argv)}".rstrip()))


def _with_command(argv: list[str]) -> list[str]:
    """argv with its subcommand first: today's flag spellings become one, and none means run."""
    if argv and (argv[0] in COMMANDS or argv[0] in ("-h", "--help")):
        return argv
    for flag, name in LEGACY_FLAGS.items():
        if flag in argv:
            return [name, *(a for a in argv if a != flag)]
    return ["run", *argv]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="The bench: our engine against Hugging Face's decoding, "
                                "its ceiling, step costs, and the GPU path.",
                                epilog="No command runs `run`: python -m specdec_core.bench --preset NAME ...")
    commands = p.add_subparsers(title="commands", metavar="{" + ",".join(COMMANDS) + "}")
    for name, command in COMMANDS.items():
        sub = commands.add_parser(name, help=command.description, description=command.description)
        command.add_arguments(sub)
        sub.set_defaults(handle=command.handle)
    return p


def _device(text: str) -> torch.device:
    """A --device value: auto is cuda where there is one, else cpu."""
    try:
        return torch.device(text if text != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError:  # torch's word for a malformed device string
        raise ValueError(f"--device takes auto, cpu, cuda or cuda:N, got {text!r}") from None


def _set_threads(threads: int | None) -> None:
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)


def _numbers(text: str, kind: type) -> list:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated numbers, got {text!r}") from None


# ---------------------------------------------------------------- run


def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", required=True, help="preset name from models.yaml (or auto)")
    p.add_argument("--config", help="a models.yaml of your own (default: the repo's)")
    p.add_argument("--questions", help="Spec-Bench JSONL (default: the project's own small set)")
    p.add_argument("--categories", help="comma-separated families (mt_bench, translation, summarization, qa, "
                   "math_reasoning, rag) or raw categories; default: all")
    p.add_argument("--limit", type=int, help="at most N questions per family")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per question and method (median kept)")
    p.add_argument("--methods", help=f"comma-separated, from {','.join(METHODS)} (default: all of them; "
                   f"{LLAMACPP} only where llama-cpp-python is installed, the vllm methods where vLLM is "
                   "importable by --vllm-python or a server is given, ours-eagle, ours-hybrid and vllm-eagle "
                   "only when the preset's EAGLE head loads, ours-medusa when its Medusa heads do)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    p.add_argument("--seed", type=int, default=0, help="base seed of Hugging Face's sampling runs (temperature > 0); ours sample unseeded, as a chat does (a seed turns the cost gate off)")
    p.add_argument("--warmup-tokens", type=int, default=16,
                   help="max_new_tokens of the untimed warm-up run per question and method (0: none)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice, usually one per core)")
    p.add_argument("--cpu-weights", choices=CPU_WEIGHTS,
                   help="the target's weights on CPU: fp32 | gguf (default: the preset's cpu_weights)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the decoding steps (default: the preset's compile setting; on CPU only the "
                        "target's, minutes the first time; compiled in the background, auto, is waited for)")
    p.add_argument("--out", default=run.DEFAULT_OUT, help=f"output folder (default: {run.DEFAULT_OUT})")
    p.add_argument("--vllm-python", help=f"an interpreter that imports vllm (its own venv): the bench starts the "
                   f"servers of {','.join(VLLM_METHODS)} with it (default: ${VLLM_PYTHON_ENV}, else this python)")
    p.add_argument("--vllm-servers", help="running OpenAI-compatible servers to ask instead, as METHOD=URL pairs: "
                   "vllm=http://127.0.0.1:8000,vllm-eagle=http://127.0.0.1:8001")


def _run(args: argparse.Namespace, command: str) -> int:
    return run.run(args, command=command)


# ---------------------------------------------------------------- ceiling


def _ceiling_arguments(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--preset", help="a preset's target (default: smollm2-135m-local)")
    which.add_argument("--target-config", help="a random-weight target: a name of data/architectures.yaml "
                       "(qwen2.5-7b, qwen2.5-0.5b, smollm2-135m, tiny, ...) or a config.json")
    p.add_argument("--config", help="a models.yaml of your own (with --preset)")
    p.add_argument("--cpu-weights", choices=CPU_WEIGHTS,
                   help="with --preset on CPU: fp32 | gguf (default: the preset's cpu_weights)")
    p.add_argument("--device", default="auto", help="with --target-config: auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="with --target-config: auto is bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="decode through compiled static-cache steps (default: the preset's setting; "
                        "with --target-config, on with CUDA)")
    p.add_argument("--acceptance", default=",".join(f"{a:g}" for a in ceiling.ACCEPTANCES), help="comma-separated a values")
    p.add_argument("--draft-lengths", default=",".join(map(str, ceiling.DRAFT_LENGTHS)), help="fixed k values, comma-separated")
    p.add_argument("--no-adaptive", action="store_true", help="leave out the adaptive policy")
    p.add_argument("--draft-cost", type=float, default=0.0, help="c: the drafter's cost per token as a share of a "
                   "measured target step (default 0: free)")
    p.add_argument("--draft-cost-mode", default="sleep", choices=COST_MODES)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=128, help="with --target-config: random prompt length")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1, help="timed runs per prompt and setting")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_out", help="output folder (ceiling.json, ceiling.md, ceiling.png)")


def _ceiling(args: argparse.Namespace, command: str) -> int:
    _set_threads(args.threads)
    if args.target_config:
        device = _device(args.device)
        compile = device.type == "cuda" if args.compile is None else args.compile
        subject = ceiling.subject_from_architecture(
            args.target_config, device=device, dtype=cost_model.torch_dtype(args.dtype, device), compile=compile,
            prompts=args.prompts, prompt_tokens=args.prompt_tokens, max_new_tokens=args.max_new_tokens, seed=args.seed,
        )
    else:
        subject = ceiling.subject_from_preset(args.preset or "smollm2-135m-local", args.config, args.compile,
                                              args.prompts, args.cpu_weights)
    result = ceiling.run_ceiling(
        subject,
        acceptances=_numbers(args.acceptance, float),
        draft_lengths=_numbers(args.draft_lengths, int),
        adaptive=not args.no_adaptive,
        draft_cost=args.draft_cost,
        cost_mode=args.draft_cost_mode,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        seed=args.seed,
    )
    result["command"] = command
    paths = write_ceiling(Path(args.out), result)
    print(ceiling_markdown(result))
    inform(f"wrote {', '.join(str(p) for p in paths)}")
    return 0 if result["identical"] else 1


# ---------------------------------------------------------------- cost-model


def _cost_model_arguments(p: argparse.ArgumentParser) -> None:
    names = ", ".join(ARCHITECTURES)
    p.add_argument("--target-config", help=f"an architecture ({names}) or a config.json path "
                   "(default: qwen2.5-7b on CUDA, qwen2.5-0.5b on CPU)")
    p.add_argument("--draft-config", help="the draft's, likewise (default: qwen2.5-0.5b on CUDA, smollm2-135m on CPU)")
    p.add_argument("--device", default="auto", help="auto (cuda if available) | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", choices=DTYPES,
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


def _cost_model(args: argparse.Namespace, command: str) -> int:
    device = _device(args.device)
    target, draft = cost_model.DEFAULTS["cuda" if device.type == "cuda" else "cpu"]
    try:
        result = cost_model.run_cost_model(
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
    except (OSError, MemoryError, torch.OutOfMemoryError) as error:  # an unreadable config, models too large
        raise ValueError(one_line(error)) from None
    paths = write_cost_model(Path(args.out), result)
    print(markdown_table(result))
    inform(f"\nwrote {paths[0]} and {paths[1]}")
    return 0


# ---------------------------------------------------------------- gpu-check


def _gpu_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    p.add_argument("--tiny", action="store_true", help="tiny configs on the CPU (about a minute; the CI test)")
    p.add_argument("--parts", help=f"comma-separated, from {','.join(gpu_check.PARTS)} (default: all)")
    p.add_argument("--device", help="cuda (default), cuda:N, or cpu")


def _gpu_check(args: argparse.Namespace, command: str) -> int:
    return gpu_check.gpu_check(Path(args.out), tiny=args.tiny, parts=args.parts, device=args.device, command=command)


COMMANDS: dict[str, Command] = {
    "run": Command(run.__doc__.splitlines()[0], _run_arguments, _run),
    "ceiling": Command(ceiling.__doc__.splitlines()[0], _ceiling_arguments, _ceiling),
    "cost-model": Command(cost_model.__doc__.splitlines()[0], _cost_model_arguments, _cost_model),
    "gpu-check": Command(gpu_check.__doc__.splitlines()[0], _gpu_check_arguments, _gpu_check),
}
