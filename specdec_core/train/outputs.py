"""The trainer's output folder: the head (config.json, model.safetensors, written by the head
module in the EAGLE-3 format), training.json (everything measured) and a README.md from it."""

from __future__ import annotations

import json
from pathlib import Path

OURS = {"config.json", "model.safetensors", "training.json", "README.md", "train_work"}
DATA_WRITERS = {  # --data-dtype: what wrote the replies and features
    "target": "the target itself, as it decodes",
    "bfloat16": "the target's weights in bf16 on stock layers (`--data-dtype bfloat16`, for speed; see `base.data_model`)",
}
MARKERS = {"training.json", "train_work"}  # what only this trainer writes there
PROMPT_SOURCES_TEXT = {  # --prompts: where the data's prompts come from
    "templates": "from the trainer's offline prompt source (`specdec_core/train/prompts.py`: topic lists x "
                 "instruction templates for conversation and role play, writing, QA, short facts, coding, translation "
                 "both ways and math word problems, plus summarization, answer-from-this-passage and translation prompts "
                 "over passages the target itself wrote).",
    "varied": "of the trainer's varied mix (`--prompts varied`, `specdec_core/train/varied.py`: template prompts, short "
              "chat, longer maths and rewriting, pasted human prose and standard-library code with a task, requests and "
              "second turns the target writes itself; see docs/training.md).",
}


def check_out(out: Path, ours: set[str] = OURS) -> None:
    """Refuse an --out that holds anything but a (possibly unfinished) run of this trainer (whose
    files are `ours`)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: give a new or empty folder")
    if not out.is_dir():
        return
    names = {path.name for path in out.iterdir()}
    if names and (not names & MARKERS or names - ours):
        shown = ", ".join(sorted(names - ours or names)[:3])
        raise ValueError(f"--out {out} holds something else ({shown}): give a new or empty folder, or one this trainer wrote")


def write_outputs(out: Path, summary: dict) -> None:
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "README.md").write_text(readme(summary))


def readme(summary: dict) -> str:
    """The head's README: how it was trained, on what, and how well it drafts on held-out replies."""
    data, training, final = summary["data"], summary["training"], summary["heldout_acceptance"]
    s = summary["settings"]
    lines = [
        f"# EAGLE-3 head for preset `{summary['preset']}`",
        "",
        "Trained by this project's trainer; the folder is in the EAGLE-3 checkpoint format (config.json with "
        "`LlamaForCausalLMEagle3`, model.safetensors with fc, midlayer, norm, lm_head, d2t, t2d; no embed_tokens).",
        "",
        "## Training command",
        "",
        "```bash",
        summary["command"] or f"python -m specdec_core.train_eagle --preset {summary['preset']} --out DIR",
        "```",
        "",
        "## Data recipe",
        "",
        f"Self-distilled: the target's own replies (chat template, at most {s['max_new_tokens']} new tokens, written "
        f"in batches on a static cache with left padding; greedy, and sampled at temperature 0.7 and 1.0) to {s['shards']} shards x "
        f"{s['per_shard']} prompts {PROMPT_SOURCES_TEXT[s.get('prompts', 'templates')]} No Spec-Bench or project bench "
        "question is among them (a test checks it).",
        "",
        f"- written by: {DATA_WRITERS[s.get('data_dtype', 'target')]}",
        f"- training: {data['train_sequences']} sequences, {data['train_reply_tokens']:,} reply tokens "
        f"({data['train_tokens']:,} with prompts); families {', '.join(f'{k} {v}' for k, v in data['families'].items())}",
        "- held out: every tenth shard (greedy replies)" + _rewritten(s)
        + f", {data['heldout_sequences']} sequences; acceptance is measured on its "
        f"{data['evaluated_sequences']} greedy replies",
        f"- draft vocabulary: the {data['draft_vocab_size']:,} tokens most frequent in the training replies; they cover "
        f"{data['draft_vocab_coverage_train']:.1%} of training reply tokens and {data['draft_vocab_coverage_heldout']:.1%} of held-out ones",
        f"- feature layers of the target (inputs of): {summary['target_layers']}; head parameters "
        f"{summary['head_parameters'] / 1e6:.1f}M",
        "",
        "## Training",
        "",
        f"Training-time test over {s['ttt_steps']} unrolled draft steps (loss weights 0.8^i), soft cross-entropy against "
        f"the target's distribution restricted to the draft vocabulary; AdamW, lr {s['lr']} (warm-up, cosine), "
        f"{s['batch']} sequences per step, seed {s['seed']}"
        + ("; the head's matmuls autocast to bf16 (`--train-dtype bfloat16`; weights, optimizer and loss in fp32). "
           if s.get("train_dtype") == "bfloat16" else ". ")
        + f"{training['steps']} of {training['planned_steps']} planned steps "
        f"({training['epochs']:.2f} epochs, {training['tokens']:,} trained positions) in {training['seconds'] / 60:.1f} "
        f"minutes on {training['threads']} thread(s)"
        + (" (stopped by --max-minutes)." if training["stopped_early"] else "."),
        "",
        f"## Held-out acceptance (greedy, k={final['k']}, weights as saved: {s['save_dtype']})",
        "",
        "Position i counts a chain only when drafts 1..i-1 matched the target's greedy tokens too, "
        f"over {final['chains']:,} draft chains (one starting at every reply position).",
        "",
        "| draft position | " + " | ".join(str(i + 1) for i in range(final["k"])) + " | mean accepted per round |",
        "|---" * (final["k"] + 2) + "|",
        "| acceptance | " + " | ".join(f"{a:.3f}" for a in final["by_position"]) + f" | {final['mean_accepted']:.3f} |",
        "",
        "Mean accepted per round: accepted draft tokens per round of k drafts (the target's bonus token not counted).",
        "",
        "## Learning curve (held-out acceptance against training)",
        "",
        "| step | epochs | trained positions | position 1 | mean accepted (k=4) |",
        "|---|---|---|---|---|",
    ]
    for point in summary["learning_curve"]:
        lines.append(f"| {point['step']} | {point['epoch']:.2f} | {point['tokens']:,} | {point['by_position'][0]:.3f} | {point['mean_accepted']:.3f} |")
    lines.append("")
    return "\n".join(lines)


def _rewritten(s: dict) -> str:
    """What the held-out line adds when a cheaper writer wrote the data: which held-out shards the
    target wrote again (the head is measured on those)."""
    if s.get("data_dtype", "target") == "target":
        return ""
    which = f"the first {s['rewrite_heldout']} of them" if s.get("rewrite_heldout") else "they are"
    return f", {which} written again by the target itself with the same prompts"
