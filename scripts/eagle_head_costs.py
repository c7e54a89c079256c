"""Does the EAGLE head's step get cheaper on prepacked fp32 or 4-bit layers? Times one draft step
of the offline preset's head (one token against a cached context, then its logits), its linear
layers as loaded (fp32), prepacked for oneDNN, and on torch's int4 kernel (Q4_1 or Q8_0 groups of
its own weights; the preset loads it on Q8_0 groups when its target is on the 4-bit path),
alternated, next to the target's 1-token step on both of the target's paths.

    python scripts/eagle_head_costs.py --threads 2 --context 128 --repeats 30

Prints the median ms per variant and c (a head step over a target step); the machine's load
average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from specdec_core.bench.machine import load_average  # noqa: E402
from specdec_core.kernels.int4_linear import quantise_linear_layers  # noqa: E402
from specdec_core.kernels.packed_linear import pack_linear_layers  # noqa: E402
from specdec_core.presets.loading import load_preset  # noqa: E402
from specdec_core.presets.sources import OFFLINE_PRESET  # noqa: E402
from specdec_core.decoding.eager import CachedModel, growing_cache  # noqa: E402


def on_int4(head: nn.Module, type_name: str = "Q4_1") -> nn.Module:
    """A copy of the head whose linear layers run on the int4 kernel, from `type_name` (Q4_1 or
    Q8_0) groups of their own weights."""
    four_bit = copy.deepcopy(head)
    quantise_linear_layers(four_bit, type_name)
    return four_bit


def head_step_ms(head, embed, context: int, repeats: int) -> float:
    """Median ms of one draft step: a token's pass through the head after `context` cached pairs."""
    width = head.config.hidden_size
    cache = growing_cache(head.config)
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        head(torch.randn(1, context, width, generator=generator), torch.randn(1, context, width, generator=generator), cache)
        token = embed(torch.tensor([[42]]))
        hidden = torch.randn(1, 1, width, generator=generator)
        times = []
        for _ in range(repeats + 3):
            started = time.perf_counter()
            out = head(token, hidden, cache)
            head.logits(out[0, -1]).argmax()
            times.append((time.perf_counter() - started) * 1000)
            cache.crop(-1)
    return statistics.median(times[3:])


def target_step_ms(model, context: int, repeats: int) -> float:
    runner = CachedModel(model)
    tokens = torch.randint(0, 49152, (context + 1,), generator=torch.Generator().manual_seed(1)).tolist()
    runner.forward(tokens[:context], last_only=True)
    times = []
    for _ in range(repeats + 3):
        started = time.perf_counter()
        runner.forward(tokens[context:])
        times.append((time.perf_counter() - started) * 1000)
        runner.crop(context)
    return statistics.median(times[3:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fp32 = load_preset(OFFLINE_PRESET, load_draft=False, load_eagle=True, cpu_weights="fp32")
    gguf = load_preset(OFFLINE_PRESET, load_draft=False, load_eagle=False, cpu_weights="gguf")
    head = fp32.eagle_head.float().eval()
    packed = copy.deepcopy(head)
    pack_linear_layers(packed)
    heads = {"head fp32": head, "head fp32 prepacked": packed, "head int4 (Q4_1)": on_int4(head),
             "head int4 (Q8_0)": on_int4(head, "Q8_0")}
    embed = fp32.target.get_input_embeddings()
    before = load_average()
    ms: dict[str, list[float]] = {name: [] for name in [*heads, "target fp32", "target gguf"]}
    for _ in range(3):  # alternated rounds, so drifting load falls on every variant
        for name, variant in heads.items():
            ms[name].append(head_step_ms(variant, embed, args.context, args.repeats))
        ms["target fp32"].append(target_step_ms(fp32.target, args.context, args.repeats))
        ms["target gguf"].append(target_step_ms(gguf.target, args.context, args.repeats))
    median = {name: statistics.median(values) for name, values in ms.items()}
    for name, value in median.items():
        line = f"{name:20s} {value:6.2f} ms"
        if name.startswith("head"):
            line += (f"   c = {value / median['target fp32']:.3f} of an fp32 target step, "
                     f"{value / median['target gguf']:.3f} of a gguf one")
        print(line)
    print(f"threads {args.threads}, context {args.context}; load average before {before}, after {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
