"""Step costs of the offline target on CPU: fp32 prepacked weights against the GGUF's own 4-bit
blocks (`cpu_weights: fp32 | gguf`), measured alternately so both see the same machine.

    python scripts/cpu_weights_costs.py --threads 2 --contexts 64,256,729 --sizes 1,5,9 --repeats 15

and a prefill of the longest context (or of each --prefills length) from an empty cache (reading
a prompt), alternated too, with the 4-bit model also reading it on the int4 kernel alone
("gguf-kernel-prompts": long calls no longer unpack the weights, see int4_linear.DENSE_ROWS).

Variants: fp32 (dequantised, prepacked: what `cpu_weights: fp32` loads), gguf (every Q4_1 layer
and the Q8_0 head on the int4 kernel: what `cpu_weights: gguf` loads), gguf-stock-layers (the same
on transformers' decoder layers, without lean_layers), gguf-fp32-head (the
layers on int4, the head prepacked fp32), with --with-draft the preset's nf4 draft, and with
--with-bf16 the weights in bf16 on stock layers with row-exact attention (the trainer's
`--data-dtype bfloat16` model, on AMX where the CPU has it). For each context length the cache is filled once
per variant; then every repetition times one forward of each size for each variant, in
rotating order, cropping back after each. Prints the median ms per (variant, context, size)
and the load average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specdec_core.bench.machine import load_average, weight_bytes_read_per_step  # noqa: E402
from specdec_core.kernels import int4_linear  # noqa: E402
from specdec_core.kernels.int4_linear import use_gguf_weights  # noqa: E402
from specdec_core.kernels.packed_linear import pack_linear_layers  # noqa: E402
from specdec_core.presets.loading import load_plain_target, load_preset  # noqa: E402
from specdec_core.presets.sources import OFFLINE_PRESET, bundled_gguf  # noqa: E402
from specdec_core.kernels.row_attention import use_row_exact_attention  # noqa: E402
from specdec_core.decoding.eager import CachedModel  # noqa: E402


def variants(with_draft: bool = False, with_bf16: bool = False) -> dict[str, torch.nn.Module]:
    fp32 = load_preset(OFFLINE_PRESET, load_draft=False, load_eagle=False, cpu_weights="fp32")
    gguf = load_preset(OFFLINE_PRESET, load_draft=with_draft, load_eagle=False, cpu_weights="gguf")
    from transformers import AutoModelForCausalLM

    from specdec_core.presets.sources import gguf_folder

    path = bundled_gguf("smollm2-135m-instruct")
    mixed = AutoModelForCausalLM.from_pretrained(gguf_folder(path), dtype=torch.float32).eval()
    use_gguf_weights(mixed, path, include_head=False)
    pack_linear_layers(mixed)
    stock = AutoModelForCausalLM.from_pretrained(gguf_folder(path), dtype=torch.float32).eval()
    use_gguf_weights(stock, path)
    use_row_exact_attention(stock)
    for models in (fp32, gguf):
        print(models.describe(), *models.notes, sep="\n", file=sys.stderr)
    found = {"fp32": fp32.target, "gguf": gguf.target, "gguf-stock-layers": stock, "gguf-fp32-head": mixed}
    if with_draft:  # the preset's nf4 draft (bitsandbytes), to compare with the 4-bit target
        found["nf4-draft"] = gguf.draft
    if with_bf16:
        found["bf16"] = load_plain_target(OFFLINE_PRESET).eval()
        use_row_exact_attention(found["bf16"])
    return found


@contextmanager
def _kernel_only(on: bool):
    """Every call of the 4-bit layers on the int4 kernel, however many rows (when on)."""
    kept = int4_linear.DENSE_ROWS
    int4_linear.DENSE_ROWS = 2**62 if on else kept
    try:
        yield
    finally:
        int4_linear.DENSE_ROWS = kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contexts", default="64,256,729")
    parser.add_argument("--sizes", default="1,5,9")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--with-draft", action="store_true", help="also time the preset's nf4 draft model")
    parser.add_argument("--with-bf16", action="store_true", help="also time the weights in bf16 on stock layers")
    parser.add_argument("--prefills", help="prompt lengths to time reading (default: the longest context)")
    parser.add_argument("--out", help="also write the result as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result: dict = {"threads": args.threads, "repeats": args.repeats, "ms": {}}
    contexts = [int(c) for c in args.contexts.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    models = variants(args.with_draft, args.with_bf16)
    result["weight_bytes_per_step"] = {name: weight_bytes_read_per_step(model) for name, model in models.items()}
    for name, size in result["weight_bytes_per_step"].items():
        print(f"{name:15s} reads {size / 1e6:.0f} MB of weights per step", flush=True)
    load_before = load_average()
    lengths = [int(n) for n in args.prefills.split(",")] if args.prefills else [max(contexts)]
    longest = max(max(contexts) + max(sizes), *lengths)
    tokens = torch.randint(0, 49152, (longest,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.inference_mode():
        for context in contexts:
            runners = {name: CachedModel(model) for name, model in models.items()}
            for runner in runners.values():
                runner.forward(tokens[:context], last_only=True)
            times: dict[tuple[str, int], list[float]] = {(n, s): [] for n in runners for s in sizes}
            names = list(runners)
            for rep in range(args.repeats + 2):  # two untimed rounds first
                order = names[rep % len(names):] + names[: rep % len(names)]
                for name in order:
                    for size in sizes:
                        started = time.perf_counter()
                        runners[name].forward(tokens[context : context + size])
                        elapsed = (time.perf_counter() - started) * 1000
                        runners[name].crop(context)
                        if rep >= 2:
                            times[(name, size)].append(elapsed)
            for (name, size), values in times.items():
                median = statistics.median(values)
                result["ms"][f"{name} ctx={context} n={size}"] = round(median, 2)
                print(f"{name:15s} context {context:4d} tokens {size}: {median:6.1f} ms", flush=True)
        # reading a prompt: a prefill from an empty cache (of the longest context, or --prefills);
        # "gguf-kernel-prompts" is the 4-bit model reading it on the int4 kernel, as before
        # long calls read on the unpacked weights (int4_linear.DENSE_ROWS)
        readers = {**models, "gguf-kernel-prompts": models["gguf"]}
        for length in lengths:
            prefill: dict[str, list[float]] = {name: [] for name in readers}
            for rep in range(max(3, args.repeats // 3)):
                for name in list(readers)[rep % len(readers):] + list(readers)[: rep % len(readers)]:
                    runner = CachedModel(readers[name])
                    with _kernel_only(name == "gguf-kernel-prompts"):
                        started = time.perf_counter()
                        runner.forward(tokens[:length], last_only=True)
                        prefill[name].append((time.perf_counter() - started) * 1000)
            for name, values in prefill.items():
                median = statistics.median(values)
                result["ms"][f"{name} prefill={length}"] = round(median, 1)
                print(f"{name:19s} prefill of {length} tokens: {median:7.1f} ms", flush=True)
    result["load_average"] = {"before": load_before, "after": load_average()}
    print(f"load average before {load_before}, after {load_average()}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
