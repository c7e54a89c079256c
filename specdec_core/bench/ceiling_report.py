"""The ceiling's result (ceiling.py) as markdown and a plot of speedup against acceptance, and
its files DIR/ceiling.json, DIR/ceiling.md and DIR/ceiling.png."""

from __future__ import annotations

from pathlib import Path

from .ceiling import ADAPTIVE, PARTS
from .outputs import write_json, write_text


def write(out: Path, result: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "ceiling.json", out / "ceiling.md", out / "ceiling.png"]
    write_json(paths[0], result)
    write_text(paths[1], markdown(result))
    plot(paths[2], result)
    return paths


def _number(value, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def markdown(result: dict) -> str:
    """The result as markdown: the settings, then one row per (a, setting), then where the time goes."""
    s, subject, costs = result["settings"], result["subject"], result["costs"]
    what = subject.get("preset") or subject.get("architecture")
    machine = result["machine"]
    lines = [
        f"Ceiling run on {machine['device']}: {what} ({subject.get('dtype')}, {subject.get('decode_path')}), "
        f"{s['prompts']} prompts of {min(s['prompt_tokens'])}-{max(s['prompt_tokens'])} tokens, "
        f"{s['max_new_tokens']} new tokens, {s['repeats']} timed run(s) each, greedy; synthetic drafter at "
        f"c = {s['draft_cost_c']:g} ({s['cost_mode'] if s['draft_cost_c'] else 'free'}); torch threads "
        f"{machine['torch_threads']}, load average {machine['load_before']} before, {machine['load_after']} after; "
        f"{s['elapsed_s']:.0f} s. torch {result['versions']['torch']}, transformers {result['versions']['transformers']}.",
        "",
        f"Probed through the engine's runner ({costs['runner']}) at {costs['context_tokens']} tokens of context: "
        f"target step {costs['target_step_ms']:.2f} ms; v (verify over 1 + g tokens / step): "
        + ", ".join(f"g={g} {v:.2f}" for g, v in costs["v"].items()) + ".",
        f"ours-baseline: {result['baseline']['tokens_per_second']} tokens/s of decoding. Every run gave ours-baseline's "
        f"tokens: {'yes' if result['identical'] else 'NO'}.",
        "",
        "Efficiency = speedup / predicted at a. The drafter's draws are random, so the acceptance it realised "
        "strays from a; the last columns predict at that realised rate, leaving the draws' luck out.",
        "",
        "| a | setting | tokens / target forward | tokens/s | speedup | predicted | efficiency | mean k | c "
        "| realised a | predicted at it | efficiency at it |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["results"]:
        predicted = f"{r['predicted_speedup']:.2f}x" + (f" (g={r['predicted_g']})" if r["setting"] == ADAPTIVE else "")
        realised = r.get("predicted_at_measured_acceptance")
        lines.append(
            f"| {r['acceptance']:g} | {r['setting']} | {r['tokens_per_target_forward']:.2f} | {r['tokens_per_second']:.1f} "
            f"| {r['speedup']:.2f}x | {predicted} | {r['efficiency']:.2f} | {r['mean_draft_length']:.1f} | {r['c']:.3f} "
            f"| {_number(r['measured_acceptance'], '.3f')} | {_number(realised, '.2f', 'x')} "
            f"| {_number(r.get('efficiency_at_measured_acceptance'), '.2f')} |"
        )
    focus = min({r["acceptance"] for r in result["results"]}, key=lambda a: abs(a - 0.8))
    lines += [
        "",
        f"Where a round's time goes at a = {focus:g} (ms per target forward; acceptance is the engine's accept "
        "step after the forward, other is the rest of the round loop: policy, stats, events, detokenizing):",
        "",
        "| setting | " + " | ".join(PARTS) + " | total |",
        "|---|" + "---|" * (len(PARTS) + 1),
    ]
    rows = [("ours-baseline", result["baseline"]["ms_per_round"])]
    rows += [(r["setting"], r["ms_per_round"]) for r in result["results"] if r["acceptance"] == focus]
    for name, parts in rows:
        lines.append(f"| {name} | " + " | ".join(f"{parts[p]:.2f}" for p in PARTS) + f" | {sum(parts.values()):.2f} |")
    return "\n".join(lines)


def plot(path: Path, result: dict) -> None:
    """Speedup against a: measured (solid, dots) and predicted (dashed), one colour per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    settings = list(dict.fromkeys(r["setting"] for r in result["results"]))
    for i, setting in enumerate(settings):
        rows = sorted((r for r in result["results"] if r["setting"] == setting), key=lambda r: r["acceptance"])
        xs = [r["acceptance"] for r in rows]
        colour = f"C{i}"
        ax.plot(xs, [r["speedup"] for r in rows], "o-", color=colour, label=f"{setting} measured")
        ax.plot(xs, [r["predicted_speedup"] for r in rows], "--", color=colour, alpha=0.7, label=f"{setting} predicted")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("acceptance a (synthetic drafter)")
    ax.set_ylabel("speedup over ours-baseline (decoding)")
    subject = result["subject"]
    ax.set_title(f"{subject.get('preset') or subject.get('architecture')} on {result['machine']['device']}, "
                 f"c = {result['settings']['draft_cost_c']:g}", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
