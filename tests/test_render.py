"""Unit tests of the app's formatting (specdec_app/render.py): escaping, colours, legend, panel text."""

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_app import render as R

SPAN = re.compile(r'<span class="tok tok-(\w+)" style="([^"]*)">(.*?)</span>', re.S)


def spans(markup: str) -> list[tuple[str, str, str]]:
    """(source, style, unescaped text) of every token span."""
    return [(src, style, html.unescape(text)) for src, style, text in SPAN.findall(markup)]


@pytest.mark.parametrize(
    "text",
    ["<b>bold</b>", "a & b", "x < y > z", "line1\nline2", "```python\nprint(1)\n```", "*x*", "_y_ **z** # h",
     "  two  spaces", '"quoted" \'single\'', "<script>alert(1)</script>", "&amp;", "\t tab"],
)
def test_token_text_round_trips_exactly(text):
    markup = R.render_tokens([(text, "draft")])
    [(source, _, shown)] = spans(markup)
    assert source == "draft"
    assert shown == text
    # Nothing the browser would parse as markup survives inside the span.
    inner = SPAN.findall(markup)[0][2]
    assert "<" not in inner and ">" not in inner


def test_each_token_is_one_span_with_its_own_class_and_colour():
    pieces = [("Hello", "target"), (",", "draft"), (" world", "bonus"), ("!", "resampled")]
    found = spans(R.render_tokens(pieces))
    assert [(src, text) for src, _, text in found] == [(s, t) for t, s in pieces]
    for source, style, _ in found:
        assert f"background-color:{R.SOURCE_COLOURS[source]}" in style
        assert "white-space:pre-wrap" in style


def test_classes_are_tok_plus_exactly_one_source():
    markup = R.render_tokens([(s, s) for s in R.SOURCES])
    classes = re.findall(r'class="([^"]*)"', markup)
    assert len(classes) == 4
    for cls, source in zip(classes, R.SOURCES):
        assert cls.split() == ["tok", f"tok-{source}"]


def test_colours_are_distinct_for_every_source():
    assert set(R.SOURCE_COLOURS) == set(R.SOURCES)
    assert len(set(R.SOURCE_COLOURS.values())) == 4


def test_unknown_source_is_refused():
    with pytest.raises(ValueError, match="unknown token source"):
        R.token_span("x", "guess")


def test_split_code_fence_tokens_concatenate_to_the_original():
    # A code block split across tokens the way a tokenizer does: the shown text must
    # be the generated text, with no markdown applied and no piece lost.
    pieces = [("``", "target"), ("`", "draft"), ("py", "draft"), ("\n", "bonus"), ("a", "resampled"),
              (" <", "draft"), ("= b", "draft"), (" &&", "target"), ("\n```", "draft")]
    shown = "".join(text for _, _, text in spans(R.render_tokens(pieces)))
    assert shown == "".join(t for t, _ in pieces)


def test_empty_pieces_make_no_span():
    assert R.render_tokens([("", "draft"), ("a", "target")]).count("<span") == 1


def test_legend_names_every_source_with_its_colour():
    legend = R.legend_html()
    found = spans(legend)
    assert [src for src, _, _ in found] == list(R.SOURCES)
    for source in R.SOURCES:
        assert html.escape(R.SOURCE_MEANINGS[source]) in legend


def test_user_text_is_escaped():
    assert R.plain_html("<i>hi</i> & *x*") == '<span style="white-space:pre-wrap">&lt;i&gt;hi&lt;/i&gt; &amp; *x*</span>'


def test_history_is_plain_text_and_view_is_html():
    turn = R.new_turn("what is <b>?")
    turn["reply"] = "a <tag>"
    turn["reply_html"] = R.render_tokens([("a", "target"), (" <tag>", "draft")])
    pending = R.new_turn("next")
    turns = [turn, pending]
    assert R.prompt_messages(turns) == [
        {"role": "user", "content": "what is <b>?"},
        {"role": "assistant", "content": "a <tag>"},
        {"role": "user", "content": "next"},
    ]
    view = R.chat_view(turns)
    assert [m["role"] for m in view] == ["user", "assistant", "user"]
    assert "&lt;b&gt;" in view[0]["content"]
    assert view[1]["content"] == turn["reply_html"]
    # The baseline pane keeps every turn apart: a turn with no baseline run gets a neutral note.
    baseline = R.chat_view(turns, pane="baseline")
    assert [m["role"] for m in baseline] == ["user", "assistant", "user", "assistant"]
    assert all(R.NO_BASELINE in m["content"] for m in baseline[1::2])


def test_baseline_pane_shows_each_turn_with_its_baseline_or_a_note():
    """Three messages, side by side ticked for the third only: three user bubbles, two notes."""
    turns = [R.new_turn("one"), R.new_turn("two"), R.new_turn("three", baseline_pending=True)]
    for turn in turns:
        turn.update(reply="r", reply_html=R.render_tokens([("r", "draft")]))
    waiting = R.chat_view(turns, pane="baseline")  # the third's baseline has not streamed yet
    assert [m["role"] for m in waiting] == ["user", "assistant", "user", "assistant", "user"]
    turns[2]["baseline_html"] = R.render_tokens([("r", "target")])
    view = R.chat_view(turns, pane="baseline")
    assert [m["role"] for m in view] == ["user", "assistant"] * 3
    assert [R.NO_BASELINE in m["content"] for m in view[1::2]] == [True, True, False]
    assert "tok-target" in view[5]["content"]
    assert [m["role"] for m in R.chat_view(turns)] == ["user", "assistant"] * 3  # the main pane: no notes


STATS = {
    "new_tokens": 40, "target_forwards": 16, "tokens_per_target_forward": 2.5, "drafted_tokens": 50,
    "accepted_tokens": 30, "acceptance_rate": 0.6, "accepted_by_position": [12, 10, 8, 0],
    "drafted_by_position": [15, 15, 15, 5], "draft_length": 4, "ttft_s": 0.125, "wall_s": 2.0,
    "tokens_per_second": 20.0, "draft_s": 0.5, "verify_s": 1.5,
}


def test_stats_panel_shows_every_figure():
    text = R.stats_markdown(STATS, "speculative · prompt lookup")
    for expected in ["20.0", "60% (30 of 50 drafted)", "2.50", "| Draft length now | 4 |", "0.12 s",
                     "0.50 s / 1.50 s (25% / 75%)", "40 tokens", "generating"]:
        assert expected in text
    assert "done" in R.stats_markdown(STATS, "speculative", done=True)
    assert "| Tokens/s after the first token | 21.3 |" in R.stats_markdown(
        dict(STATS, decode_tokens_per_second=21.3), "speculative")


def test_panel_shows_the_tree_size_after_tree_rounds_only():
    trees = dict(STATS, tree_rounds=4, tree_nodes_verified=50, tree_accepted_depth=6, mean_accepted_depth=1.5)
    text = R.stats_markdown(trees, "speculative · Medusa heads", last_tree_nodes=16)
    assert "| Tree size (nodes verified) | 16 in the last tree round · 12.5 per tree round (4 tree rounds) |" in text
    assert "| Accepted depth per tree round | 1.50 |" in text
    assert "Tree size" not in R.stats_markdown(dict(STATS, tree_rounds=0), "speculative · prompt lookup")


def tree_nodes(markup: str):
    """The tree view parsed: (element tree, every node's <li>)."""
    import xml.etree.ElementTree as ET

    view = ET.fromstring(markup)  # well-formed: every tag closed, every text escaped
    return view, view.findall(".//li")


def test_tree_view_marks_the_kept_path_and_dims_the_rejected_branches():
    # two roots ("a", "<b>"); "a" has children "c\n" and "d"; the target kept a -> d, a leaf, then
    # added its bonus token "e"
    markup = R.tree_html(["a", "<b>", "c\n", "d"], [-1, -1, 0, 0], [0, 3], ("e & f", "bonus"))
    view, items = tree_nodes(markup)
    chips = {"".join(li[0].itertext()): li for li in items}
    assert set(chips) == {"a", "<b>", "c↵", "d", "e & f"}  # escaped, shown as their text; a line break visible
    kept = [text for text, li in chips.items() if "tree-kept" in li.get("class")]
    assert kept == ["a", "d"] and all(chips[t][0].get("class") == "tok tok-draft" for t in kept)
    assert chips["e & f"][0].get("class") == "tok tok-bonus" and "tree-path" in chips["e & f"].get("class")
    for text in ("<b>", "c↵"):  # rejected: dimmed, in none of the four sources' colours
        chip = chips[text][0]
        assert chip.get("class") == "tree-rejected" and "background" not in chip.get("style")
        assert "opacity" in chip.get("style")
    # the tree's shape: "d" under "a", the bonus under "d"
    assert chips["d"] in chips["a"].iter("li") and chips["e & f"] in chips["d"].iter("li")
    assert chips["c↵"] in chips["a"].iter("li") and chips["e & f"] not in chips["<b>"].iter("li")
    assert "4 nodes, 2 deep" in "".join(view.itertext()) and "&lt;b&gt;" in markup


def test_tree_view_of_a_round_that_kept_nothing_and_before_any_tree():
    markup = R.tree_html(["x", "y"], [-1, -1], [], ("z", "resampled"))
    view, items = tree_nodes(markup)
    assert [li.get("class") for li in items] == ["tree-node tree-rejected-branch"] * 2 + ["tree-path tree-target"]
    assert items[-1][0].get("class") == "tok tok-resampled"  # the target's own token, under the root
    assert R.tree_html(None) == "" and R.tree_html([]) == ""
    assert R.tree_text("") == "∅" and R.tree_text("a\tb") == "a⇥b"


def test_baseline_panel_has_speed_but_no_acceptance():
    base = dict(STATS, drafted_tokens=0, accepted_tokens=0, acceptance_rate=0.0, draft_s=0.0)
    text = R.stats_markdown(base, "baseline")
    assert "Tokens/s | 20.0" in text
    assert "Acceptance" not in text


def test_stop_marks_the_panel_and_keeps_the_numbers():
    live = R.stats_markdown(STATS, "baseline")
    stopped = R.stopped_markdown(live)
    assert "stopped" in stopped and "generating" not in stopped
    assert stopped.replace("stopped", R.GENERATING) == live
    done = R.stats_markdown(STATS, "baseline", done=True)
    assert R.stopped_markdown(done) == done


def test_empty_stats_say_waiting():
    assert "waiting" in R.stats_markdown(None, "baseline")


def test_acceptance_frame_per_position():
    frame = R.acceptance_frame(STATS)
    assert list(frame["position"]) == ["1", "2", "3", "4"]
    assert list(frame["acceptance"]) == pytest.approx([0.8, 10 / 15, 8 / 15, 0.0])
    empty = R.acceptance_frame(None)
    assert empty.empty
    # Typed even when empty: the plot takes each axis's scale type from its first value.
    assert empty["acceptance"].dtype == float and empty["drafted"].dtype == int
    assert R.acceptance_frame({"accepted_by_position": [], "drafted_by_position": [0]})["acceptance"].tolist() == [0.0]


def test_speedup_text():
    base = dict(STATS, tokens_per_second=10.0)
    assert "**Speedup: 2.00× end to end · – decode phase**" in R.speedup_markdown(STATS, base, True)
    assert "identical ✓" in R.speedup_markdown(STATS, base, True)
    assert "DIFFER" in R.speedup_markdown(STATS, base, False)
    tie = R.speedup_markdown(STATS, base, False, "bfloat16")  # on a GPU in bf16: say what it means
    assert "rounding tie" in tie and "in float32 they are identical" in tie and "DIFFER" not in tie
    assert "identical ✓" in R.speedup_markdown(STATS, base, True, "bfloat16")
    assert "by design" in R.speedup_markdown(STATS, base, None)
    assert "side by side" in R.speedup_markdown(None, None, None)
    assert "no tokens" in R.speedup_markdown(STATS, dict(base, tokens_per_second=0.0), True)


def test_side_by_side_shows_both_ttfts_and_both_speedups():
    spec = dict(STATS, ttft_s=0.5, tokens_per_second=13.3, decode_tokens_per_second=26.0, prompt_tokens_read=812)
    base = dict(STATS, ttft_s=0.48, tokens_per_second=10.0, decode_tokens_per_second=13.0, prompt_tokens_read=812)
    text = R.speedup_markdown(spec, base, True)
    assert text.startswith("**Speedup: 1.33× end to end · 2.00× decode phase** (end to end: speculative 13.3 tok/s "
                           "vs baseline 10.0 tok/s; after the first token: 26.0 vs 13.0 tok/s) · outputs identical ✓")
    assert text.endswith("Time to first token: baseline 480 ms · speculative 500 ms (both read 812 prompt tokens)")
    unfair = R.speedup_markdown(dict(spec, prompt_tokens_read=1), base, True)  # what a shared cache did
    assert unfair.endswith("(the baseline read 812 prompt tokens, the speculative reply 1)")


def test_models_text_is_one_code_line_per_model():
    text = R.models_markdown("target: Qwen2_5 *Instruct* 1.5B, 3.1 GB\ndraft: small `x`, 0.2 GB\n")
    assert text.count("\n- `") == 2
    assert "`target: Qwen2_5 *Instruct* 1.5B, 3.1 GB`" in text
    assert "not loaded" in R.models_markdown(None)
    noted = R.models_markdown("target: t", notes=["auto picked <tiny>"])
    assert "- note: auto picked &lt;tiny&gt;" in noted


def test_render_module_does_not_import_torch():
    code = "import sys; from specdec_app import render; assert 'torch' not in sys.modules and 'gradio' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def test_the_loaded_models_say_when_a_greedy_difference_can_be_a_rounding_tie():
    import torch

    from specdec_core.presets.loaded import LoadedModels
    from tests.tiny_models import tiny_llama

    def loaded(model) -> LoadedModels:
        return LoadedModels(preset=None, tokenizer=None, target=model, draft=None, info=[])

    model = tiny_llama(seed=0, vocab=100)
    assert loaded(model).low_precision() is None  # fp32: identical or a bug
    assert loaded(model.to(torch.bfloat16)).low_precision() == "bfloat16"
