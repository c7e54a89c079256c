"""Formatting for the chat app: token events -> coloured HTML, stats -> panel text and plot data.

Pure functions over plain values (strings, dicts of the engine's stat names); no torch and no
gradio here, so the formatting is unit-tested without models or a server.

The chat pane shows HTML with markdown rendering switched off, so every piece of token text
is HTML-escaped and sits in a span whose style keeps whitespace: what the model generated is
exactly what is shown, code fences and `*stars*` included.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

# Token sources, exactly the engine's strings (docs/INTERFACES.md).
SOURCES = ("draft", "resampled", "bonus", "target")

# Light backgrounds, readable in both themes because the text colour is fixed too.
# Green / orange / blue / grey stay apart for the common colour-vision deficiencies.
SOURCE_COLOURS = {
    "draft": "#b7ebc6",
    "resampled": "#fdd49e",
    "bonus": "#b9d7f9",
    "target": "#e5e7eb",
}

SOURCE_MEANINGS = {
    "draft": "drafted and accepted by the target (a token the target did not have to generate alone)",
    "resampled": "the target rejected the draft here and drew its own token",
    "bonus": "every draft in the round was accepted; the target's extra token from the same forward",
    "target": "plain decoding: no draft at this step (baseline, or the drafter had nothing)",
}

# pre-wrap keeps newlines and runs of spaces exactly; the fixed text colour keeps the light
# backgrounds readable under a dark theme.
_SPAN_STYLE = "background-color:{colour};color:#111827;white-space:pre-wrap;border-radius:2px"


def token_span(text: str, source: str) -> str:
    """One token as `<span class="tok tok-SOURCE" style=...>escaped text</span>`."""
    if source not in SOURCE_COLOURS:
        raise ValueError(f"unknown token source {source!r}; expected one of {SOURCES}")
    style = _SPAN_STYLE.format(colour=SOURCE_COLOURS[source])
    return f'<span class="tok tok-{source}" style="{style}">{html.escape(text)}</span>'


def render_tokens(pieces: Iterable[tuple[str, str]]) -> str:
    """(text, source) pairs -> concatenated spans.

    Empty pieces are skipped: the incremental detokenizer holds back a token whose bytes
    do not yet form a whole character, and the next token carries that text.
    """
    return "".join(token_span(text, source) for text, source in pieces if text)


def plain_html(text: str) -> str:
    """User text for the HTML chat pane: escaped, whitespace kept, no colour."""
    return f'<span style="white-space:pre-wrap">{html.escape(text)}</span>'


def legend_html() -> str:
    """A legend with one example chip per source and what it means."""
    rows = [
        f"<li>{token_span(source, source)} {html.escape(SOURCE_MEANINGS[source])}</li>"
        for source in SOURCES
    ]
    return '<ul class="tok-legend" style="list-style:none;padding-left:0;margin:0">' + "".join(rows) + "</ul>"


# ---------------------------------------------------------------- chat panes


RETRIED = "retried"  # a turn's key: the turn a Retry replaces (see new_turn)


def new_turn(user: str, baseline_pending: bool = False, retried: Mapping | None = None) -> dict:
    """One exchange, kept as plain text plus its rendered HTML (the HTML is never parsed back).

    Keys: user, reply (plain text, what the next prompt uses), reply_html, baseline_html
    (the baseline pane's reply in side-by-side mode: "" until it streams; None: no baseline run);
    for a Retry, `retried`: the turn it replaces, which Stop puts back if no token came yet (one
    level only: the replaced turn's own `retried` is dropped).
    """
    turn = {"user": user, "reply": "", "reply_html": "", "baseline_html": "" if baseline_pending else None}
    if retried is not None:
        turn[RETRIED] = {key: value for key, value in retried.items() if key != RETRIED}
    return turn


def prompt_messages(turns: Sequence[Mapping]) -> list[dict]:
    """Plain-text chat messages for the tokenizer's chat template; unanswered turns skipped."""
    messages: list[dict] = []
    for turn in turns:
        messages.append({"role": "user", "content": turn["user"]})
        if turn["reply"]:
            messages.append({"role": "assistant", "content": turn["reply"]})
    return messages


def context_limit_note(limit: int) -> str:
    """The note that ends a reply the model's context limit cut short (never part of the reply text)."""
    return (f'<div class="reply-note" style="font-style:italic;opacity:0.8;margin-top:0.5em">'
            f"The reply stopped at the model's context limit ({limit} tokens): press Clear to start "
            f"a new conversation.</div>")


NO_BASELINE = "no baseline run for this turn"
_NOTE_STYLE = "white-space:pre-wrap;color:#6b7280;font-style:italic"


def chat_view(turns: Sequence[Mapping], pane: str = "main") -> list[dict]:
    """Chatbot messages for a pane: `main` shows reply_html, `baseline` shows baseline_html.

    In the baseline pane a turn that had no baseline run (baseline_html None) gets a neutral
    note as its reply, so each turn keeps its own user bubble (the chatbot merges consecutive
    messages of one role). A turn whose baseline is about to run has baseline_html "".
    """
    key = "reply_html" if pane == "main" else "baseline_html"
    messages: list[dict] = []
    for turn in turns:
        messages.append({"role": "user", "content": plain_html(turn["user"])})
        if turn.get(key):
            messages.append({"role": "assistant", "content": turn[key]})
        elif pane != "main" and turn.get(key) is None:
            messages.append({"role": "assistant", "content": f'<span style="{_NOTE_STYLE}">{NO_BASELINE}</span>'})
    return messages


# ---------------------------------------------------------------- the live panel


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def duration(value: float | None) -> str:
    """A time to first token: '35 ms' under a second (a kept cache makes them short), else '4.52 s'."""
    if value is None:
        return "–"
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"


def stats_markdown(stats: Mapping | None, mode: str, done: bool = False, last_tree_nodes: int | None = None) -> str:
    """The live numbers as a small markdown table.

    `stats` holds the engine's stat names (Stats.as_dict()); `mode` names what produced them
    (e.g. "speculative · prompt lookup" or "baseline"). Acceptance figures are left out for
    baseline decoding, where nothing is drafted. After a tree round, the trees' size: the nodes
    the last tree round verified (`last_tree_nodes`) and the mean per tree round.
    """
    if not stats:
        return f"**{mode}** · waiting for a message"
    state = GENERATING
    if done:
        state = "cut at the context limit" if stats.get("finish_reason") == "length (context)" else "done"
    rows = [("Tokens/s", f"{stats.get('tokens_per_second', 0.0):.1f}")]
    if stats.get("decode_tokens_per_second"):  # from the second round on
        rows.append(("Tokens/s after the first token", f"{stats['decode_tokens_per_second']:.1f}"))
    drafted = stats.get("drafted_tokens", 0)
    if mode != "baseline":
        rate = stats.get("acceptance_rate", 0.0) if drafted else 0.0
        rows += [
            ("Acceptance rate", f"{rate:.0%} ({stats.get('accepted_tokens', 0)} of {drafted} drafted)"),
            ("Tokens per target forward", f"{stats.get('tokens_per_target_forward', 0.0):.2f}"),
            ("Draft length now", str(stats.get("draft_length", "–"))),
        ]
        rows += _tree_rows(stats, last_tree_nodes)
    rows.append(("Time to first token", _seconds(stats.get("ttft_s"))))
    rows.append(("Time drafting / verifying", _time_split(stats)))
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    header = f"**{mode}** · {stats.get('new_tokens', 0)} tokens · {state}"
    return f"{header}\n\n| figure | value |\n|---|---|\n{table}"


def _tree_rows(stats: Mapping, last_tree_nodes: int | None) -> list[tuple[str, str]]:
    """The trees' size and depth, once a round verified a tree (none for chains)."""
    rounds = stats.get("tree_rounds") or 0
    if not rounds:
        return []
    mean = stats.get("tree_nodes_verified", 0) / rounds
    last = f"{last_tree_nodes} in the last tree round · " if last_tree_nodes else ""
    return [("Tree size (nodes verified)", f"{last}{mean:.1f} per tree round ({rounds} tree rounds)"),
            ("Accepted depth per tree round", f"{stats.get('mean_accepted_depth', 0.0):.2f}")]


GENERATING = "generating…"
LOADING = "Loading models… (first message only)"


def stopped_before_reply_markdown(still_loading: str | None) -> str:
    """The panel after Stop ended a reply before its first token; `still_loading`: the preset
    that goes on loading in the background, if any."""
    if still_loading:
        return (f"**Stopped** before the reply started. Preset {still_loading} keeps loading in the "
                "background; your message is back in the box: send it again when you like.")
    return "**Stopped** before the reply started; your message is back in the box."


def stopped_before_retry_markdown(still_loading: str | None) -> str:
    """The panel after Stop ended a Retry before its first token: the earlier reply is back."""
    loading = f" Preset {still_loading} keeps loading in the background." if still_loading else ""
    return f"**Stopped** before the new reply started; the earlier reply is kept.{loading}"


def stopped_markdown(panel: str) -> str:
    """The panel after Stop: the last numbers stay, marked stopped instead of generating."""
    return panel.replace(GENERATING, "stopped", 1)


def _time_split(stats: Mapping) -> str:
    draft_s = stats.get("draft_s") or 0.0
    verify_s = stats.get("verify_s") or 0.0
    total = draft_s + verify_s
    if total <= 0:
        return "–"
    return f"{draft_s:.2f} s / {verify_s:.2f} s ({draft_s / total:.0%} / {verify_s / total:.0%})"


def acceptance_frame(stats: Mapping | None) -> pd.DataFrame:
    """Per-position acceptance (accepted / drafted at draft position i) for a bar plot.

    Positions are strings so the plot draws one bar per position instead of binning.
    """
    accepted = list((stats or {}).get("accepted_by_position") or [])
    drafted = list((stats or {}).get("drafted_by_position") or [])
    rows = [
        {"position": str(i + 1), "acceptance": accepted[i] / n if n else 0.0, "drafted": n}
        for i, n in enumerate(drafted)
    ]
    # Typed even when empty: the plot fixes each axis's scale type from the first value it gets.
    frame = pd.DataFrame(rows, columns=["position", "acceptance", "drafted"])
    return frame.astype({"position": str, "acceptance": float, "drafted": int})


# ---------------------------------------------------------------- the last tree round

# Draft nodes the target did not keep: no background, so no colour of the four sources is
# borrowed; dimmed and struck through, with a dashed outline to keep a blank token visible.
_REJECTED_STYLE = ("color:#6b7280;opacity:0.55;text-decoration:line-through;border:1px dashed #9ca3af;"
                   "border-radius:2px;white-space:pre")
# font-size inherit: the page's own list styles shrink nested lists, and a tree nests deep
_TREE_LIST_STYLE = "list-style:none;margin:0;padding-left:1.1em;border-left:1px solid #d1d5db;font-size:inherit"
_TREE_ITEM_STYLE = "margin:0;padding:0;font-size:inherit"


def tree_text(text: str) -> str:
    """A token's text as a tree node shows it: line breaks and tabs made visible (a node is one
    line), an empty piece (part of a character) as ∅. Escaped by the caller."""
    return text.replace("\n", "↵").replace("\t", "⇥") if text else "∅"


def tree_html(pieces: Sequence[str] | None, parents: Sequence[int] = (), path: Sequence[int] = (),
              closing: tuple[str, str] | None = None) -> str:
    """The last tree round (#tree): every drafted node under its parent, the accepted path in the
    draft colour (the target kept those drafts), the target's own token at the path's end in its
    colour (bonus after a leaf, resampled otherwise), the rejected branches dimmed. "" before a
    tree round (nothing shown).

    pieces: each node's token text; parents: Draft.parents (-1: the context's last token);
    path: the kept nodes from the root; closing: (text, source) of the target's token."""
    if not pieces:
        return ""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    kept = set(path)
    last = path[-1] if path else -1

    def branch(parent: int) -> str:
        items = []
        for node in children.get(parent, []):
            shown = tree_text(pieces[node])
            if node in kept:
                kind, chip = "tree-path tree-kept", token_span(shown, "draft")
            else:
                kind = "tree-rejected-branch"
                chip = f'<span class="tree-rejected" style="{_REJECTED_STYLE}">{html.escape(shown)}</span>'
            items.append(f'<li class="tree-node {kind}" style="{_TREE_ITEM_STYLE}">{chip}{branch(node)}</li>')
        if parent == last and closing is not None:
            text, source = closing
            chip = token_span(tree_text(text), source)
            items.append(f'<li class="tree-path tree-target" style="{_TREE_ITEM_STYLE}" title="the target\'s own token">'
                         f'{chip}</li>')
        return f'<ul style="{_TREE_LIST_STYLE}">{"".join(items)}</ul>' if items else ""

    depth = _depth(parents)
    rejected = len(pieces) - len(kept)
    head = (f"<b>Last tree round</b>: {len(pieces)} nodes, {depth} deep · the target kept a path of "
            f"{len(kept)} and added its own token · {rejected} rejected node{'s' if rejected != 1 else ''} dimmed")
    return (f'<div class="tree-view" style="font-size:0.85rem;line-height:1.6">'
            f'<div class="tree-head">{head}</div>'
            f'<div class="tree-root" style="color:#6b7280">▸ the reply so far</div>{branch(-1)}</div>')


def _depth(parents: Sequence[int]) -> int:
    depths: list[int] = []
    for parent in parents:
        depths.append(depths[parent] + 1 if parent >= 0 else 1)
    return max(depths, default=0)


def speedup_markdown(
    spec: Mapping | None, base: Mapping | None, identical: bool | None, low_precision: str | None = None
) -> str:
    """The side-by-side result: the end-to-end speedup (tokens/s over tokens/s, both halves
    having read the same prompt tokens alike), the decode-phase speedup (the rates after the
    first token) and both times to first token.

    `identical` is None for sampled decoding, where outputs differ by design. `low_precision`:
    the target's dtype when it is bfloat16 or float16. Greedy outputs are identical in float32;
    in those dtypes a near-tie between two tokens can round differently in a 1-token step and a
    (k+1)-token verify step, so the outputs are identical or differ from such a tie on.
    """
    if not spec or not base:
        return "Speedup: tick **side by side** and send a message to compare with the baseline."
    spec_tps = spec.get("tokens_per_second") or 0.0
    base_tps = base.get("tokens_per_second") or 0.0
    if base_tps <= 0:
        return "Speedup: – (the baseline produced no tokens)"
    spec_decode = spec.get("decode_tokens_per_second") or 0.0
    base_decode = base.get("decode_tokens_per_second") or 0.0
    decode = f"{spec_decode / base_decode:.2f}×" if spec_decode > 0 and base_decode > 0 else "–"
    line = (f"**Speedup: {spec_tps / base_tps:.2f}× end to end · {decode} decode phase** "
            f"(end to end: speculative {spec_tps:.1f} tok/s vs baseline {base_tps:.1f} tok/s; "
            f"after the first token: {spec_decode:.1f} vs {base_decode:.1f} tok/s)")
    read = (base.get("prompt_tokens_read"), spec.get("prompt_tokens_read"))
    alike = f"both read {read[0]} prompt tokens" if read[0] == read[1] else \
        f"the baseline read {read[0]} prompt tokens, the speculative reply {read[1]}"
    reading = (f"Time to first token: baseline {duration(base.get('ttft_s'))} · speculative "
               f"{duration(spec.get('ttft_s'))} ({alike})")
    return f"{line}{_identity_note(identical, low_precision)}\n\n{reading}"


def _identity_note(identical: bool | None, low_precision: str | None) -> str:
    if identical is None:
        return " · sampling: the two outputs differ by design"
    if identical:
        return " · outputs identical ✓"
    if low_precision:
        return (f" · outputs differ from a rounding tie on ({low_precision}: a 1-token step and a verify "
                "step can round a near-tie apart; in float32 they are identical)")
    return " · outputs DIFFER ✗"


def models_markdown(description: str | None, notes: Sequence[str] = (), caches: str | None = None) -> str:
    """The loaded models (LoadedModels.describe(): one line per model), the memory of the kept KV
    caches (LoadedModels.cache_line()) and the loader's notes."""
    if not description:
        return "Models: not loaded yet (they load with the first message or the preset menu)."
    lines = [line.strip() for line in description.splitlines() if line.strip()]
    # Code spans keep names like Qwen2_5 or *-Instruct from turning into markdown emphasis.
    text = "**Models**\n\n" + "\n".join("- `" + line.replace("`", "'") + "`" for line in lines)
    if caches:
        text += f"\n- {html.escape(caches)}"
    if notes:
        text += "\n\n" + "\n".join(f"- note: {html.escape(note)}" for note in notes)
    return text
