"""How many positions per second does the EAGLE trainer's step train, on random features?

`nice -n 19 python scripts/train_throughput.py --threads 1 --steps 12`

The bundled head's shapes (SmolLM2-135M's width, an 8,192-token draft vocabulary, 3 unrolled
draft steps) and the trainer's step (train/trainer.py: the training-time test under bf16
autocast, backward, clipping, AdamW) on random sequences of prompts of 40-300 tokens and replies
of 60-192, batched as the trainer batches them (sorted by length within groups of 16 batches).
No data or target weights are read, so it measures the step alone. It prints trained positions
(reply positions at draft step 1, the trainer's `tokens`) per wall-clock second and per
CPU-second of this process (the fair number when the machine is shared), with the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from specdec_core.drafters.eagle_head import Eagle3Head  # noqa: E402
from specdec_core.train.base import keep_freed_memory  # noqa: E402
from specdec_core.train.dataset import Sequence, make_batch  # noqa: E402
from specdec_core.train.ttt import ttt_loss  # noqa: E402


def autocast(train_dtype: str):
    """The trainer's --train-dtype: bf16 autocast of the head's matmuls, or plain fp32."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if train_dtype == "bfloat16" else contextlib.nullcontext()


def random_sequences(count: int, hidden: int, vocab: int, generator: torch.Generator) -> list[Sequence]:
    sequences = []
    for _ in range(count):
        prompt = int(torch.randint(40, 301, (), generator=generator))
        reply = int(torch.randint(60, 193, (), generator=generator))
        n = prompt + reply
        sequences.append(Sequence(ids=torch.randint(0, vocab, (n,), generator=generator),
                                  aux=torch.randn(n - 1, 3 * hidden, generator=generator).half(),
                                  final=torch.randn(n - 1, hidden, generator=generator).half(),
                                  reply_start=prompt, mode="t1.0", family="random"))
    return sorted(sequences, key=lambda s: len(s.ids))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head", default=str(ROOT / "heads" / "smollm2-135m-eagle3"), help="a head folder: its shapes")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=12, help="timed optimizer steps (after 2 warm-up steps)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--ttt-steps", type=int, default=3)
    p.add_argument("--train-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    args = p.parse_args()
    keep_freed_memory()  # as the trainers' processes do
    torch.set_num_threads(args.threads)
    head = Eagle3Head.load(args.head).float().train()
    hidden, vocab = head.config.hidden_size, head.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    embedding = torch.nn.Embedding(vocab, hidden)
    embedding.requires_grad_(False)
    draft_lm_head = torch.randn(head.draft_vocab_size, hidden, generator=generator) * 0.05
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-4)
    sequences = random_sequences(args.batch * (args.steps + 2), hidden, vocab, generator)
    batches = [sequences[i : i + args.batch] for i in range(0, len(sequences), args.batch)]
    batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    trained = 0
    for index, chosen in enumerate(batches):
        if index == 2:  # warm-up done
            wall, cpu, trained = time.perf_counter(), time.process_time(), 0
        with autocast(args.train_dtype):
            loss, report = ttt_loss(head, embedding, draft_lm_head, make_batch(chosen, args.ttt_steps), args.ttt_steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        trained += report[1][2]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{args.train_dtype}, batch {args.batch}, {args.ttt_steps} draft steps, {args.threads} thread(s): "
          f"{trained} trained positions in {args.steps} steps, {trained / wall:.0f}/s wall, "
          f"{trained / cpu:.0f} per CPU-second, {wall / args.steps:.2f} s a step, load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
