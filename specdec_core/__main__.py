"""Command line: `python -m specdec_core presets` and `python -m specdec_core generate ...`.

Flags and the --json keys are a contract (issue 3). The reply goes to stdout; what was
loaded, notes and the stats summary go to stderr, so `--json` output stays one object.
Errors are one line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from .cli import EXIT_ERROR, inform, run_guarded  # noqa: F401  (EXIT_ERROR: this command's exit code)
from .presets.config import AUTO, DRAFTERS, MODEL_FLAGS, config_with_models, load_config, menu_label


def main(argv: list[str] | None = None, prog: str = "python -m specdec_core") -> int:
    args = _parser(prog).parse_args(argv)
    return run_guarded(lambda: args.run(args))


def installed_command() -> int:
    """The `specdec` command of an installed package (pyproject's [project.scripts])."""
    return main(prog="specdec")


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=f"List the model presets ({prog} presets) or reply "
                                                             f"to one prompt ({prog} generate ...).")
    commands = parser.add_subparsers(dest="command", required=True)

    presets = commands.add_parser("presets", help="list the presets and what each needs")
    presets.add_argument("--config", help="a models.yaml of your own (default: the repo's)")
    presets.set_defaults(run=run_presets)

    generate = commands.add_parser("generate", help="reply to one prompt with speculative decoding")
    generate.add_argument("--preset", default=AUTO, help="preset name (default: auto)")
    generate.add_argument("--config", help="a models.yaml of your own (default: the repo's)")
    for key in MODEL_FLAGS:
        generate.add_argument(f"--{key}", help=MODEL_FLAGS[key])
    generate.add_argument("--prompt", required=True, help="the user message")
    generate.add_argument("--system", help="a system prompt")
    generate.add_argument("--drafter", choices=DRAFTERS, help="default: the preset's")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    generate.add_argument("--top-p", type=float, default=1.0, help="1.0 is off (default)")
    generate.add_argument("--top-k", type=int, default=0, help="0 is off (default)")
    generate.add_argument("--max-new-tokens", type=int, default=256)
    generate.add_argument("--seed", type=int,
                          help="makes sampling reproducible: the same seed, prompt and settings give the same "
                               "tokens on this device and dtype (draft lengths then follow acceptance only)")
    generate.add_argument("--draft-length", type=int, help="tokens per draft (default: the preset's)")
    generate.add_argument("--no-adaptive", action="store_true", help="keep the draft length fixed")
    generate.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                          help="compiled decoding steps, compiled at load (default: the preset's "
                               "`compile`, auto: on with CUDA, off on CPU for one reply)")
    generate.add_argument("--json", action="store_true", help='print {"text", "finish_reason", "token_ids", "sources", "stats"}')
    generate.set_defaults(run=run_generate)
    return parser


def run_presets(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    width = max(len(name) for name in [AUTO, *config.presets])
    print(f"{AUTO:<{width}}  the largest GPU preset that fits and can load here, else {config.auto_fallback}")
    for preset in config.presets.values():
        print(f"{preset.name:<{width}}  {preset.description}")
        print(f"{'':<{width}}    needs: {preset.needs()}; default drafter: {preset.drafter}")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    # A bad models.yaml, preset name or model path is told before torch loads (seconds).
    config, preset = config_with_models(args.config, args.preset, {key: getattr(args, key) for key in MODEL_FLAGS})
    if preset != AUTO:
        config.find(preset)
    # Imported here so `presets`, `--help` and those errors answer without loading torch.
    from .chat import chat_prompt_ids
    from .presets.loading import load_preset
    from .sampling import SamplingParams

    params = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    # Only drafter "model" needs the draft, and "hybrid" where the preset's EAGLE head can't
    # serve (None: load it if the preset's default drafter is "model").
    load_draft = args.drafter in ("model", "hybrid") if args.drafter else None
    # One reply: it would end before steps compiled in the background were ready.
    models = load_preset(preset, config, load_draft=load_draft, compile=args.compile,
                         compile_in_background=False)
    inform(f"preset: {menu_label(models.preset)}", *models.notes, models.describe())
    engine = models.make_engine(
        drafter=args.drafter,
        draft_length=args.draft_length,
        adaptive=False if args.no_adaptive else None,
    )
    prompt_ids = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": args.prompt}], system=args.system)
    if args.json:
        result = engine.generate(prompt_ids, params)
        reply = {
            "text": result.text,
            "finish_reason": result.stats.finish_reason,
            "token_ids": result.token_ids,
            "sources": result.sources,
            "stats": result.stats.as_dict(),
        }
        print(json.dumps(reply, ensure_ascii=False))
    else:
        for event in engine.stream(prompt_ids, params):
            print(event.text, end="", flush=True)
        print()
    inform(_summary(engine.stats))
    return 0


def _summary(stats) -> str:
    return (
        f"{stats.new_tokens} tokens in {stats.wall_s:.2f} s ({stats.tokens_per_second:.1f} tokens/s), "
        f"acceptance {stats.acceptance_rate:.0%}, {stats.tokens_per_target_forward:.2f} tokens per target forward, "
        f"finished: {stats.finish_reason}"
    )


if __name__ == "__main__":
    sys.exit(main())
