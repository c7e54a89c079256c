"""How long the background compile of the offline preset's steps takes (cold: an empty cache
folder; warm: the folder a run before filled), and how fast replies decode while it runs,
against eager decoding with no compile (issue 47, point 5).

    python scripts/compile_timing.py --cache /tmp/specdec-cold           # cold, no chat
    python scripts/compile_timing.py --cache /tmp/specdec-cold           # again: warm
    python scripts/compile_timing.py --cache /tmp/specdec-chat --chat    # cold, chatting meanwhile
    python scripts/compile_timing.py --eager                             # replies with no compile

--cache becomes $SPECDEC_CACHE (compiled steps and inductor's cache under it); the GGUF's converted
folder is linked in from the usual cache, so only the compile starts cold. The chat: greedy
64-token replies to three prompts in turn, 2 s apart, the preset's drafter; each reply's rate is
its new tokens after the first over the time after the first. The load average is printed
beside every number: the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PAUSE_S = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2-135m-local")
    parser.add_argument("--cache", type=Path, help="the cache folder ($SPECDEC_CACHE) the compile uses")
    parser.add_argument("--chat", action="store_true", help="reply while the steps compile")
    parser.add_argument("--eager", action="store_true", help="no compile: eager replies only")
    parser.add_argument("--chat-s", type=float, help="chat for at most this long, then stop (without waiting for the compile)")
    parser.add_argument("--replies", type=int, default=12, help="replies after the compile (or eager)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    if args.cache:
        _use_cache(args.cache)

    from scripts.measure_presets import PROMPTS
    from specdec_core import SamplingParams
    from specdec_core.chat import chat_prompt_ids
    from specdec_core.presets.loading import load_preset

    started = time.perf_counter()
    models = load_preset(args.preset, load_draft=False, compile=False if args.eager else None)
    print(f"loaded in {time.perf_counter() - started:.0f} s {_load()}", flush=True)
    steps = models.path("target")
    compile_started = time.perf_counter()
    prompts = [chat_prompt_ids(models.tokenizer, [{"role": "user", "content": text}]) for text in PROMPTS.values()]
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    engine = models.engine()

    def reply(index: int) -> float:
        engine.forget()
        result = engine.generate(prompts[index % len(prompts)], params)
        stats = result.stats
        return (len(result.token_ids) - 1) / (stats.wall_s - stats.ttft_s)

    during = []
    while args.chat and steps.compiling and (args.chat_s is None or time.perf_counter() - compile_started < args.chat_s):
        during.append(reply(len(during)))
        print(f"  reply while compiling ({_progress(steps)}): {during[-1]:.1f} tok/s {_load()}", flush=True)
        time.sleep(PAUSE_S)
    if during:
        print(f"while compiling: median {statistics.median(during):.1f} tok/s over {len(during)} replies")
    if args.chat_s is not None:
        return
    if not args.eager:
        steps.ready.wait()
        print(f"chain steps ready {time.perf_counter() - compile_started:.0f} s after the load {_load()}", flush=True)
    models.wait_for_compiling()
    if not args.eager:
        print(f"compile ended {time.perf_counter() - compile_started:.0f} s after the load "
              f"(warm-up {steps.warmup_s:.0f} s, {steps.loaded} of {len(steps.step_sizes) + len(steps.tree_sizes)} compiled steps (chains and trees) loaded from "
              f"the cache, {_cpu_s():.0f} CPU seconds since the start); decode path: {models.decode_path} {_load()}",
              flush=True)
    after = [reply(i) for i in range(args.replies)]
    label = "eager" if args.eager else "compiled"
    print(f"{label}: median {statistics.median(after):.1f} tok/s over {len(after)} replies {_load()}; "
          f"{_cpu_s():.0f} CPU seconds in all")


def _use_cache(folder: Path) -> None:
    """$SPECDEC_CACHE = folder, with the converted GGUF folder of the usual cache linked in."""
    from specdec_core.presets.sources import cache_root

    usual = cache_root() / "gguf"
    folder.mkdir(parents=True, exist_ok=True)
    if usual.is_dir() and not (folder / "gguf").exists():
        (folder / "gguf").symlink_to(usual)
    os.environ["SPECDEC_CACHE"] = str(folder)


def _progress(steps) -> str:
    return f"{steps.shapes_ready}/{len(steps.step_sizes)} shapes"


def _cpu_s() -> float:
    """CPU time of this process and the compiler processes it ran."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _load() -> str:
    return "(load average %.1f %.1f %.1f)" % os.getloadavg()


if __name__ == "__main__":
    main()
