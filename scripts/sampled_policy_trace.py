"""Does the draft policy stop drafting where drafting loses? Sampled runs of the offline preset,
paired question by question: plain decoding, the EAGLE head under today's policy, and the head
under the policy's step costs as they were at another commit (`--costs-from`).

    python scripts/sampled_policy_trace.py --limit 2 --tokens 96 --threads 1 --costs-from bee34cc~1

For each Spec-Bench question (`--limit` per family) each engine reads the prompt afresh and
samples `--tokens` tokens at `--temperature`, unseeded as a chat (a seed switches the cost gate
off), chains only as the bench's ours-eagle. Prints decode tokens/s and CPU ms per token (process
time: steadier than wall time on a shared machine) per question, their geometric means against
plain decoding, and the head's acceptance by draft position; `--out` keeps every round the
head's policy decided (its length, the rates and costs it priced the round at, what it got).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from specdec_core.bench.questions import load_questions  # noqa: E402
from specdec_core.chat import chat_prompt_ids  # noqa: E402
from specdec_core.presets.loading import load_preset  # noqa: E402
from specdec_core.sampling import SamplingParams  # noqa: E402


def costs_module(revision: str):
    """specdec_core/policy/costs.py as it was at `revision`, as a module of its own."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:specdec_core/policy/costs.py"],
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "costs_then.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("costs_then", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["costs_then"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def traced(policy, trace: list) -> None:
    """Record each round the policy decides: what it chose and priced, then what it measured."""
    choose, learn = policy.next_draft_length, policy.update
    pending = {}

    def next_draft_length(room, lag=0):
        k = choose(room, lag)
        pending.update(k=k, lag=lag, rates=policy.rates(max(k, 1)), step_s=policy.costs.target(1),
                       draft_s_per_token=policy.costs.draft_s_per_token)
        return k

    def update(drafted, accepted, draft_s, verify_s, depth=None):
        trace.append({**pending, "drafted": drafted, "accepted": accepted, "draft_s": draft_s, "verify_s": verify_s})
        return learn(drafted, accepted, draft_s, verify_s, depth)

    policy.next_draft_length, policy.update = next_draft_length, update


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", default=str(ROOT.parent / "shared/data/spec_bench_questions.jsonl"))
    parser.add_argument("--limit", type=int, default=2, help="questions per family")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadiest on a shared machine)")
    parser.add_argument("--costs-from", help="also run the head with policy/costs.py from this git revision")
    parser.add_argument("--out", help="a JSON file for the rows and the policy's rounds")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = load_preset("smollm2-135m-local", load_draft=False, compile=False, load_medusa=False)
    engines = {"base": models.make_engine(drafter="none"), "eagle": models.make_engine(drafter="eagle")}
    if args.costs_from:
        then = engines["eagle-then"] = models.make_engine(drafter="eagle")
        then.policy.costs = then.policy.trees.costs = costs_module(args.costs_from).StepCosts()
    trace: list = []
    traced(engines["eagle"].policy, trace)
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.tokens)
    warm_up = SamplingParams(temperature=args.temperature, max_new_tokens=8)
    rows = []
    for index, question in enumerate(load_questions(args.questions, None, args.limit)):
        ids = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": question.prompt}])
        names = list(engines)
        names = names[index % len(names):] + names[:index % len(names)]  # rotate the order
        row = {"question": question.question_id, "family": question.family, "prompt_tokens": len(ids)}
        for name in names:
            engines[name].forget()
            engines[name].generate(ids, warm_up, 0)
        for name in names:
            engines[name].forget()
            started = time.process_time()
            stats = engines[name].generate(ids, params, 0).stats
            row[name] = {"cpu_s": time.process_time() - started, "tokens": stats.new_tokens,
                         "decode_tps": stats.decode_tokens_per_second, "forwards": stats.target_forwards,
                         "drafted_by_position": stats.drafted_by_position,
                         "accepted_by_position": stats.accepted_by_position}
        rows.append(row)
        print(question.family, len(ids), "tok/s", " ".join(f"{n}={row[n]['decode_tps']:.1f}" for n in engines),
              "| cpu ms/token", " ".join(f"{n}={1e3 * row[n]['cpu_s'] / row[n]['tokens']:.1f}" for n in engines),
              flush=True)
    for name in list(engines)[1:]:
        wall = math.exp(statistics.mean(math.log(r[name]["decode_tps"] / r["base"]["decode_tps"]) for r in rows))
        cpu = math.exp(statistics.mean(math.log((r["base"]["cpu_s"] / r["base"]["tokens"])
                                                / (r[name]["cpu_s"] / r[name]["tokens"])) for r in rows))
        drafted = [sum(r[name]["drafted_by_position"][i] for r in rows if i < len(r[name]["drafted_by_position"]))
                   for i in range(3)]
        kept = [sum(r[name]["accepted_by_position"][i] for r in rows if i < len(r[name]["accepted_by_position"]))
                for i in range(3)]
        forwards = sum(r[name]["forwards"] for r in rows)
        print(f"{name}: {wall:.3f}x base by decode tok/s, {cpu:.3f}x by CPU time per token; "
              f"kept/drafted by position {[f'{k}/{d}' for k, d in zip(kept, drafted) if d]}; "
              f"{sum(r[name]['tokens'] for r in rows) / forwards:.2f} tokens per target forward")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "rounds": trace}, indent=1))


if __name__ == "__main__":
    main()
