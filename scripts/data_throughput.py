"""How many reply tokens per second does the trainer's data writer give, by writer and batch size?

`python scripts/data_throughput.py --threads 1 --runs generate:32,static:32,static:128`

Each run writes greedy replies (with the head's features captured) to the same template prompts
with the preset's bf16 twin (--data-dtype bfloat16), `generate` (transformers' `model.generate`,
the writer before issue 48) or `static` (train/batch_generate.py). It prints wall-clock tokens/s
and tokens per CPU-second of this process (the fair number when the machine is shared) with the
load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specdec_core.chat import chat_prompt_ids  # noqa: E402
from specdec_core.drafters.eagle_head import default_layer_ids  # noqa: E402
from specdec_core.presets.loading import load_plain_target, load_preset  # noqa: E402
from specdec_core.train import data  # noqa: E402
from specdec_core.train.batch_generate import generate_batch  # noqa: E402
from specdec_core.train.prompts import direct_prompts  # noqa: E402


def _generate(model, tokenizer, prompts, new, layers):
    """The writer before batch_generate: `model.generate` with left padding and feature hooks."""
    from specdec_core.train.features import capture_features

    eos = data.eos_ids(model, tokenizer)
    width = max(map(len, prompts))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad(), capture_features(model, layers):
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                             eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    return [row[: next((i + 1 for i, t in enumerate(row) if t in eos), len(row))] for row in out[:, width:].tolist()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="smollm2-135m-local")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", default="generate:32,static:32,static:128", help="writer:rows, comma-separated")
    p.add_argument("--max-new-tokens", type=int, default=192)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = load_preset(args.preset, None, load_draft=False, compile=False).tokenizer
    model = load_plain_target(args.preset, None, dtype=torch.bfloat16)
    layers = default_layer_ids(model.config.num_hidden_layers)
    eos = data.eos_ids(model, tokenizer)
    for run in args.runs.split(","):
        writer, rows = run.split(":")
        prompts = sorted((chat_prompt_ids(tokenizer, [{"role": "user", "content": q.text}]) for q in direct_prompts(int(rows), seed=1)), key=len)
        wall, cpu = time.perf_counter(), time.process_time()
        if writer == "generate":
            replies = _generate(model, tokenizer, prompts, args.max_new_tokens, layers)
        else:
            replies, _ = generate_batch(model, prompts, max_new_tokens=args.max_new_tokens, eos=eos,
                                        pad=tokenizer.pad_token_id, layer_ids=layers)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        tokens = sum(map(len, replies))
        print(f"{writer} rows={rows}: {tokens} reply tokens, {tokens / wall:.0f} tokens/s wall, "
              f"{tokens / cpu:.0f} per CPU-second, load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
