"""The cost model's result (cost_model.py) as a markdown table, and its files OUT.json and OUT.md."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .outputs import write_json, write_text


def write(out: Path, result: dict) -> list[Path]:
    """OUT.json (the result) and OUT.md (its table); returns their paths."""
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(".json"), out.with_suffix(".md")]
    write_json(paths[0], result)
    write_text(paths[1], markdown_table(result))
    return paths


def markdown_table(result: dict) -> str:
    """The result as a markdown table: one column per mode."""
    modes = list(result["modes"])
    target, draft = result["models"]["target"], result["models"]["draft"]
    lines = [
        f"Cost model on {result['device']} ({result['dtype']}), target {target['config']} "
        f"({_millions(target['parameters'])} params), draft {draft['config']} ({_millions(draft['parameters'])}), "
        f"{result['context_tokens']} tokens of context, median of {result['repeats']} calls, random weights. "
        f"Bandwidth {result['bandwidth_gbs']:g} GB/s ({result['bandwidth_source']})."
        + (f" Compiled: the app's steps (sizes padded up to the next compiled one) on its static cache of "
           f"{result['static_cache_tokens']} slots, which every step attends over." if result.get("static_cache_tokens") else ""),
        "",
        "| | " + " | ".join(modes) + " |",
        "|---|" + "---|" * len(modes),
    ]

    def row(label: str, cell: Callable[[dict], str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(result["modes"][m]) for m in modes) + " |")

    row("decode path (target / draft)", lambda r: f"{r['target_path']} / {r['draft_path']}")
    row("target 1-token step (ms)", lambda r: f"{r['target_step_ms']:.2f}")
    ks = list(result["modes"][modes[0]]["verify_ms"])
    for k in ks:
        row(f"target verify k={k} (ms)", lambda r, k=k: f"{r['verify_ms'][k]:.2f}")
    row("draft 1-token step (ms)", lambda r: f"{r['draft_step_ms']:.2f}")
    row("c = draft step / target step", lambda r: f"{r['c']:.3f}")
    row("baseline tokens/s", lambda r: f"{r['baseline_tokens_per_s']:.1f}")
    row("fraction of bandwidth ceiling", lambda r: f"{r['bandwidth_fraction']:.0%} of {r['bandwidth_ceiling_tokens_per_s']:.0f} tok/s")
    for a in result["modes"][modes[0]]["predicted_speedup"]:
        row(f"predicted speedup at acceptance {a} (best k)",
            lambda r, a=a: f"{r['predicted_speedup'][a]['speedup']:.2f}x (k={r['predicted_speedup'][a]['draft_length']})")
    if result.get("eagle"):
        head = result["eagle"]
        lines.append(f"| EAGLE-3 head step (ms; {_millions(head['parameters'])} params, eager) | "
                     + " | ".join(f"{head['step_ms']:.2f}" for _ in modes) + " |")
        lines.append("| c of the EAGLE-3 head | " + " | ".join(f"{head['modes'][m]['c']:.3f}" for m in modes) + " |")
        for a in head["modes"][modes[0]]["predicted_speedup"]:
            cells = [head["modes"][m]["predicted_speedup"][a] for m in modes]
            lines.append(f"| EAGLE-3: predicted speedup at acceptance {a} (best k) | "
                         + " | ".join(f"{x['speedup']:.2f}x (k={x['draft_length']})" for x in cells) + " |")
    fallbacks = [f"{m} {role}: {why}" for m in modes for role, why in result["modes"][m]["fallback"].items() if why]
    if fallbacks:
        lines += ["", "Compilation fell back to eager: " + "; ".join(fallbacks)]
    return "\n".join(lines)


def _millions(count: int) -> str:
    return f"{count / 1e6:,.0f}M" if count >= 1e7 else f"{count / 1e6:.2f}M"


