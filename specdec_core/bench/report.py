"""Benchmark results: figures per method and category, the issue's targets, and the output
files (results.json, results.md, speedup.png, acceptance.png). No timing happens here."""

from __future__ import annotations

import math
from pathlib import Path

from .methods import (
    BASELINE_OF,
    HF_GENERATE,
    HF_LOOKUP,
    NEEDS_DRAFT_MODEL,
    OURS_BASELINE,
    OURS_LOOKUP,
    OURS_MODEL,
)
from .questions import FAMILY_LABELS, Question
from .runs import Run, RunTotals
from .theory_check import ProbedCosts, theory_check
from .vllm_server import VLLM

OVERALL = "overall"


def median_run(runs: list[Run]) -> Run:
    """The run with the median wall time (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda r: r.wall_s)
    return ordered[(len(ordered) - 1) // 2]


def identity(questions: list[Question], runs: dict, methods: list[str], greedy: bool) -> dict:
    """Per method: which questions gave exactly ours-baseline's tokens (greedy runs only)."""
    if not greedy or OURS_BASELINE not in methods:
        return {m: None for m in methods}
    out = {}
    for method in methods:
        mismatches = []
        for q in questions:
            reference = runs[q.question_id, OURS_BASELINE][0].token_ids
            if any(run.token_ids != reference for run in runs[q.question_id, method]):
                mismatches.append(q.question_id)
        out[method] = {
            "questions": len(questions),
            "identical": len(questions) - len(mismatches),
            "share": (len(questions) - len(mismatches)) / len(questions),
            "mismatched_questions": mismatches,
        }
    return out


def summarize(
    questions: list[Question], runs: dict, methods: list[str], greedy: bool, costs: dict[str, ProbedCosts]
) -> dict:
    """The `results`, `theory`, `identity` and `targets` parts of results.json."""
    families = list(dict.fromkeys(q.family for q in questions))
    counts = {m: {f: RunTotals() for f in [*families, OVERALL]} for m in methods}
    identical = {m: {f: [] for f in [*families, OVERALL]} for m in methods}
    asked = {f: sum(q.family == f for q in questions) for f in families} | {OVERALL: len(questions)}
    same = identity(questions, runs, methods, greedy)
    for q in questions:
        for m in methods:
            run = median_run(runs[q.question_id, m])
            counts[m][q.family].add(run)
            counts[m][OVERALL].add(run)
            if same[m] is not None:
                ok = q.question_id not in same[m]["mismatched_questions"]
                identical[m][q.family].append(ok)
                identical[m][OVERALL].append(ok)

    results: dict = {m: {} for m in methods}
    for m in methods:
        for f in families:
            results[m][f] = _figures(counts[m][f], identical[m][f], asked[f])
    for m in methods:
        for f in families:
            for other, key in _SPEEDUPS:
                results[m][f][key] = _ratio(results, m, other, f)
                results[m][f]["decode_" + key] = _ratio(results, m, other, f, DECODE_RATE)
        results[m][OVERALL] = _figures(counts[m][OVERALL], identical[m][OVERALL], asked[OVERALL])
        for _, key in _SPEEDUPS:
            for name in (key, "decode_" + key):
                results[m][OVERALL][name] = geomean(results[m][f][name] for f in families)

    theory: dict = {}
    for m in methods:
        baseline = BASELINE_OF.get(m)
        if baseline is None or baseline not in methods:
            continue
        theory[m] = {}
        for f in families:
            if f not in costs:
                continue
            # Leviathan's formula prices decoding rounds: the measured figure it is checked
            # against is the decode-phase one (the prompt reading, alike on both sides, left out).
            measured = _ratio(results, m, baseline, f, DECODE_RATE)
            theory[m][f] = theory_check(counts[m][f], costs[f], m in NEEDS_DRAFT_MODEL, measured)
        theory[m][OVERALL] = {"efficiency_geomean": geomean(t["efficiency"] for t in theory[m].values())}
    return {
        "families": families,
        "results": results,
        "theory": theory,
        "identity": same,
        "targets": targets(results, families),
    }


# vLLM's speculative methods against its own plain decoding (None where vllm didn't run): the
# theory check leaves them out, its costs are our target's steps, not vLLM's.
_SPEEDUPS = ((HF_GENERATE, "speedup_vs_hf_generate"), (OURS_BASELINE, "speedup_vs_ours_baseline"),
             (VLLM, "speedup_vs_vllm"))
# The decode-phase rate: tokens after each run's first round over the time after its first token,
# the app's definition (Stats.decode_tokens_per_second); tokens_per_second is end to end.
DECODE_RATE = "decode_tokens_per_second"


def _figures(c: RunTotals, identical: list[bool], questions: int) -> dict:
    return {
        "questions": questions,
        "new_tokens": c.new_tokens,
        "wall_s": c.wall_s,
        "tokens_per_second": c.new_tokens / c.wall_s if c.wall_s > 0 else 0.0,
        "ttft_s": c.ttft_s / c.runs if c.runs else None,  # mean over the runs counted
        DECODE_RATE: c.decode_tokens / c.decode_s if c.decode_s > 0 else 0.0,
        "mean_accepted_tokens": c.new_tokens / c.rounds if c.rounds else 0.0,
        "acceptance_rate": c.accepted / c.drafted if c.drafted else None,
        "identical_to_baseline": sum(identical) / len(identical) if identical else None,
        "target_forwards": c.rounds,
        "plain_rounds": c.plain_rounds,
        "drafted_tokens": c.drafted,
        "accepted_tokens": c.accepted,
        "rejections": c.rejections,
        "drafted_by_position": c.drafted_by_position,
        "accepted_by_position": c.accepted_by_position,
        # Of the rounds whose kept path reached depth d - 1 (and drafted on from there), the share
        # that kept a token at depth d: a chain's acceptance by position, a tree's by depth.
        "acceptance_by_depth": c.nodes.acceptance_by_depth(),
        "tree_rounds": c.nodes.tree_rounds,
        # Trees only: per-node acceptance by depth and sibling rank, and the tokens per drafting
        # round it predicts beside those measured (None: no tree was verified).
        "trees": c.nodes.as_dict() if c.nodes.tree_rounds else None,
    }


def _ratio(results: dict, method: str, other: str, family: str, rate: str = "tokens_per_second") -> float | None:
    if other not in results or family not in results[other]:
        return None
    mine, theirs = results[method][family][rate], results[other][family][rate]
    return mine / theirs if theirs else None


def geomean(values) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def targets(results: dict, families: list[str]) -> list[dict]:
    """The issue's targets, each with the measured value and whether it is met."""
    checks = []

    def check(target: str, value: float | None, threshold: float, detail: str = "") -> None:
        if value is not None:
            checks.append({
                "target": target, "value": value, "threshold": threshold,
                "met": value >= threshold, "detail": detail,
            })

    def speedup(method: str, other: str, family: str) -> float | None:
        return _ratio(results, method, other, family) if method in results else None

    if OURS_LOOKUP in results:
        check("ours-lookup vs hf-generate, geometric mean over categories",
              geomean(speedup(OURS_LOOKUP, HF_GENERATE, f) for f in families), 1.2)
        check("ours-lookup vs hf-lookup, geometric mean over categories",
              geomean(speedup(OURS_LOOKUP, HF_LOOKUP, f) for f in families), 1.15)
        for family in ("translation", "rag"):
            if family in families:
                check(f"ours-lookup vs hf-generate on {family}", speedup(OURS_LOOKUP, HF_GENERATE, family), 1.5)
    if OURS_BASELINE in results:
        values = {f: speedup(OURS_BASELINE, HF_GENERATE, f) for f in families}
        worst = _worst(values)
        check("ours-baseline within 10% of hf-generate (geometric mean)", geomean(values.values()), 0.90,
              f"worst category: {worst[0]} {worst[1]:.2f}x" if worst else "")
    for method in (OURS_LOOKUP, OURS_MODEL):
        if method in results and OURS_BASELINE in results:
            worst = _worst({f: speedup(method, OURS_BASELINE, f) for f in families})
            if worst:
                check(f"{method} no category below 0.97x ours-baseline (worst category)",
                      worst[1], 0.97, f"worst: {worst[0]}")
    return checks


def _worst(values: dict) -> tuple[str, float] | None:
    """The category with the lowest known value, and that value (None if none is known)."""
    known = {f: v for f, v in values.items() if v is not None}
    if not known:
        return None
    worst = min(known, key=known.get)
    return worst, known[worst]


# ---------------------------------------------------------------- files


def write_markdown(path: Path, report: dict) -> None:
    path.write_text(markdown(report), encoding="utf-8")


def _calibration_lines(calibration: dict) -> list[str]:
    """ours-layer-skip's calibration: its choice, and each subset it tried."""
    rows = [f"| {p['name']} | {len(p['kept'])} | {p['acceptance']:.2f} | {p['cost']:.2f} | {p['draft_length']} | "
            f"{p['speedup']:.2f}x |" for p in calibration["patterns"]]
    return ["## Layer-skip calibration (ours-layer-skip's drafter, at load)", "", calibration["line"], "",
            "| layers run | of them | acceptance | draft step / target step | k | predicted |",
            "|---|---|---|---|---|---|", *rows, ""]


def markdown(report: dict) -> str:
    """results.md: the run's settings and the tables of results.json."""
    families, results, methods = report["families"], report["results"], list(report["results"])
    columns = [*families, OVERALL]
    heads = [_label(f) for f in columns]
    s = report["settings"]
    lines = [
        f"# Benchmark: preset `{report['preset']['name']}`",
        "",
        f"`{report['command']}`",
        "",
        f"- machine: {report['machine']['summary']}",
        f"- device: {report['device']}; torch threads: {report['machine']['torch_threads']}",
        f"- load average before / after: {report['machine']['load_before']} / {report['machine']['load_after']}",
        f"- {s['questions']} questions ({s['questions_file']}), {s['max_new_tokens']} new tokens max, "
        f"temperature {s['temperature']}, median of {s['repeats']} runs after a {s['warmup_tokens']}-token "
        f"warm-up per question and method; total time {s['elapsed_s'] / 60:.1f} min",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "",
        "## Speedup over hf-generate (overall: geometric mean over categories)",
        "",
        *_table(methods, heads, lambda m, f: _x(results[m][f].get("speedup_vs_hf_generate")), columns),
        "",
        "## Speedup over ours-baseline",
        "",
        *_table(methods, heads, lambda m, f: _x(results[m][f].get("speedup_vs_ours_baseline")), columns),
        "",
        "## Decode-phase speedup over ours-baseline (after the first token: the prompt reading left out)",
        "",
        *_table(methods, heads, lambda m, f: _x(results[m][f].get("decode_speedup_vs_ours_baseline")), columns),
        "",
        *(_vllm_lines(methods, heads, results, columns) if VLLM in results else []),
        "## Tokens per second (end to end: the prompt reading included)",
        "",
        *_table(methods, heads, lambda m, f: f"{results[m][f]['tokens_per_second']:.1f}", columns),
        "",
        "## Decode tokens per second (tokens after the first round / time after the first token)",
        "",
        *_table(methods, heads, lambda m, f: f"{results[m][f][DECODE_RATE]:.1f}", columns),
        "",
        "## Time to first token (mean of the runs, ms)",
        "",
        *_table(methods, heads, lambda m, f: _ms(_times(results[m][f]["ttft_s"], 1e3)), columns),
        "",
        "## Mean accepted tokens (new tokens per target decoding forward)",
        "",
        *_table(methods, heads, lambda m, f: f"{results[m][f]['mean_accepted_tokens']:.2f}", columns),
        "",
        "## Acceptance rate (accepted / drafted tokens)",
        "",
        *_table(methods, heads, lambda m, f: _pct(results[m][f]["acceptance_rate"]), columns),
        "",
        "## Identical to ours-baseline (share of questions, greedy)",
        "",
        *_table(methods, heads, lambda m, f: _pct(results[m][f]["identical_to_baseline"]), columns),
        "",
    ]
    if report.get("layer_skip_calibration"):
        lines += _calibration_lines(report["layer_skip_calibration"])
    mismatches = {m: v["mismatched_questions"] for m, v in report["identity"].items() if v and v["mismatched_questions"]}
    if mismatches:
        lines += ["Mismatched questions: " + "; ".join(f"{m}: {', '.join(q)}" for m, q in mismatches.items()), ""]
    if report["theory"]:
        lines += [
            "## Theory check (Leviathan et al.): predicted vs measured decode-phase speedup over the method's "
            "own baseline",
            "",
            "a: acceptance probability per drafted token; g: mean draft length of drafting rounds (a tree's: "
            "its nodes); c: draft cost per drafted token (ours: timed during the runs) / target 1-token step, "
            "and in brackets the part of it that was catch-up (reading what plain rounds left); "
            "v: verify step / 1-token step; share: rounds that drafted. Methods that verified trees are "
            "predicted from their per-node acceptance instead of a (see Trees).",
            "",
            "| method | category | a | g | c | v | share | predicted | measured | efficiency |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for m, per_family in report["theory"].items():
            for f, t in per_family.items():
                if f == OVERALL:
                    continue
                lines.append(
                    f"| {m} | {_label(f)} | {t['a']:.2f} | {t['g']:.2f} | {t['c']:.3f} ({t.get('c_catch_up', 0.0):.3f}) | {t['v']:.2f} | "
                    f"{t['draft_share']:.2f} | {_x(t['predicted_speedup'])} | {_x(t['measured_speedup'])} | "
                    f"{_pct(t['efficiency'])} |"
                )
        lines.append("")
    lines += _tree_lines(report)
    if report.get("step_costs"):
        lines += [
            "## Step costs (median of probes, ms)",
            "",
            "| category | context tokens | target 1-token step | verify 1+4 | verify 1+8 | draft step | c | lookup |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for f, c in report["step_costs"].items():
            lines.append(
                f"| {_label(f)} | {c['context_tokens']} | {c['target_step_ms']:.1f} | {_ms(c['verify_ms'].get('4'))} | "
                f"{_ms(c['verify_ms'].get('8'))} | {_ms(c['draft_step_ms'])} | "
                f"{'' if c['draft_cost_ratio_c'] is None else format(c['draft_cost_ratio_c'], '.2f')} | "
                f"{c['lookup_ms']:.2f} |"
            )
        lines.append("")
    if report.get("bandwidth"):
        b = report["bandwidth"]
        lines += [
            "## Memory-bandwidth ceiling",
            "",
            f"A decoding step reads the target's weights once: {b['weight_bytes_per_step'] / 1e6:.0f} MB as loaded "
            f"here. This machine reads {b['read_bandwidth_gbs']:.1f} GB/s ({b['bandwidth_source']}), so plain "
            f"decoding can't pass {b['ceiling_tokens_per_s']:.0f} tokens/s. Share of that ceiling, overall "
            "(above 100%: speculation reads the weights once for several tokens; a method that runs its "
            "own copy of the weights, llamacpp or a vLLM server the bench started, is measured against that "
            "copy's bytes):",
            "",
            "| method | tokens/s | share of ceiling |",
            "|---|---|---|",
            *(f"| {m} | {results[m][OVERALL]['tokens_per_second']:.1f} | {_pct(share)} |"
              for m, share in b["share_of_ceiling"].items()),
            "",
        ]
    if report["targets"]:
        lines += ["## Targets (issue 5)", "", "| target | measured | needed | met |", "|---|---|---|---|"]
        for t in report["targets"]:
            detail = f" ({t['detail']})" if t["detail"] else ""
            lines.append(f"| {t['target']}{detail} | {t['value']:.2f} | {t['threshold']:.2f} | "
                         f"{'yes' if t['met'] else '**no**'} |")
        lines.append("")
    return "\n".join(lines)


def _tree_lines(report: dict) -> list[str]:
    """The tree methods' section: acceptance by depth, and the tree theory line (tokens per
    drafting round expected from the per-node acceptance, beside those measured)."""
    results, theory = report["results"], report.get("theory") or {}
    methods = [m for m in results if results[m][OVERALL].get("trees")]
    if not methods:
        return []
    lines = [
        "## Trees: acceptance by depth and the tree theory line",
        "",
        "Acceptance at depth d: of the rounds whose kept path reached depth d - 1, the share that kept a "
        "token at depth d. Expected tokens per drafting round: 1 + the sum over the drafted nodes of the "
        "product of the per-node acceptance (by depth and sibling rank) along each node's path; the "
        "predicted speedup prices those tokens at the drafting and verify costs of the nodes drafted.",
        "",
        "| method | category | tree rounds / drafting rounds | nodes per drafting round | acceptance by depth | "
        "tokens per drafting round: expected / measured | predicted | measured | efficiency |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in methods:
        for f, figures in results[m].items():
            trees = figures.get("trees")
            if not trees:
                continue
            t = theory.get(m, {}).get(f, {})
            depths = " · ".join(f"{rate:.2f}" for rate in trees["acceptance_by_depth"])
            lines.append(
                f"| {m} | {_label(f)} | {trees['tree_rounds']} / {trees['drafting_rounds']} | "
                f"{trees['nodes_per_drafting_round']:.1f} | {depths} | "
                f"{trees['expected_tokens_per_drafting_round']:.2f} / {trees['measured_tokens_per_drafting_round']:.2f} | "
                f"{_x(t.get('predicted_speedup'))} | {_x(t.get('measured_speedup'))} | {_pct(t.get('efficiency'))} |"
            )
    lines.append("")
    return lines


def _vllm_lines(methods, heads, results, columns) -> list[str]:
    """vLLM's methods over its own plain decoding (each engine's speculation against itself)."""
    served = [m for m in methods if m.startswith(VLLM)]
    return ["## Speedup over vllm (vLLM's plain decoding)", "",
            *_table(served, heads, lambda m, f: _x(results[m][f].get("speedup_vs_vllm")), columns), ""]


def _table(methods, heads, cell, columns) -> list[str]:
    rows = ["| method | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    rows += ["| " + m + " | " + " | ".join(cell(m, f) for f in columns) + " |" for m in methods]
    return rows


def _label(family: str) -> str:
    return FAMILY_LABELS.get(family, family)


def _x(value) -> str:
    return "" if value is None else f"{value:.2f}x"


def _pct(value) -> str:
    return "" if value is None else f"{100 * value:.0f}%"


def _times(value, factor: float):
    return None if value is None else value * factor


def _ms(value) -> str:
    return "" if value is None else f"{value:.1f}"


# ---------------------------------------------------------------- plots


def plot_speedup(path: Path, report: dict) -> None:
    """Bars: speedup over hf-generate (over ours-baseline without it) by category and method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families, results = report["families"], report["results"]
    methods = list(results)
    key = "speedup_vs_hf_generate" if HF_GENERATE in results else "speedup_vs_ours_baseline"
    reference = HF_GENERATE if HF_GENERATE in results else OURS_BASELINE
    columns = [*families, OVERALL]
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(columns)), 4.8))
    for i, m in enumerate(methods):
        values = [results[m][f].get(key) or 0.0 for f in columns]
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(columns))]
        ax.bar(xs, values, width, label=m)
        for x, value in zip(xs, values):
            if value:
                ax.text(x, value, f"{value:.2f}", ha="center", va="bottom", fontsize=6, rotation=90)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels([_label(f).replace(" (", "\n(") for f in columns], fontsize=8)
    ax.set_ylabel(f"speedup over {reference}")
    ax.set_title(f"{report['preset']['name']}: speedup by category ({report['device']}, "
                 f"{report['settings']['max_new_tokens']} new tokens, temperature {report['settings']['temperature']})",
                 fontsize=9)
    ax.legend(fontsize=8, ncol=3)
    ax.set_ylim(0, max(1.2, ax.get_ylim()[1] * 1.1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_acceptance(path: Path, report: dict) -> None:
    """Per speculative method: share of drafted tokens accepted at each draft position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families, results = report["families"], report["results"]
    from matplotlib.ticker import MaxNLocator

    methods = [m for m in results if results[m][OVERALL]["drafted_tokens"] > 0]
    columns = min(max(len(methods), 1), 2)
    rows = max(1, math.ceil(len(methods) / columns))
    fig, grid = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.4 * rows), squeeze=False)
    axes = [ax for row in grid for ax in row]
    for ax in axes[len(methods):]:
        ax.set_axis_off()
    if not methods:
        axes[0].text(0.5, 0.5, "no method drafted any token", ha="center", va="center")
    for ax, m in zip(axes, methods):
        for f in [*families, OVERALL]:
            drafted, accepted = results[m][f]["drafted_by_position"], results[m][f]["accepted_by_position"]
            xs = [i + 1 for i, d in enumerate(drafted) if d]
            ys = [accepted[i] / drafted[i] for i, d in enumerate(drafted) if d]
            style = {"color": "black", "linewidth": 2.2} if f == OVERALL else {"linewidth": 1.0}
            ax.plot(xs, ys, marker="o", markersize=3, label=_label(f), **style)
        ax.set_title(m, fontsize=10)
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted / drafted")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{report['preset']['name']}: share of drafted tokens accepted, by draft position", fontsize=10)
    fig.tight_layout()
    if methods:
        handles, labels = axes[0].get_legend_handles_labels()
        fig.subplots_adjust(bottom=0.1 + 0.12 / rows)
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=7, frameon=False)
    fig.savefig(path, dpi=120)
    plt.close(fig)
