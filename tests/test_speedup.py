"""The live speedup's pure parts (specdec_app/speedup.py): which plain rate a reply is compared with,
its label, the theory beside it, the race chart's data; and the history's rows and CSV
(specdec_app/history.py), which hold those rates and speedups."""

from __future__ import annotations

import csv

import pandas as pd
import pytest

from specdec_app import history as H
from specdec_app import speedup as S
from specdec_core.events import RoundTally
from specdec_core.theory import predicted_speedup

NOW = 1_000_000.0


def reply_stats(decode_tps: float, ttft_s: float = 0.5, tokens: int = 97, first_round: int = 1) -> dict:
    """The stats of a reply whose tokens after its first round came at `decode_tps`, as the engine
    counts them (tokens_per_second: end to end, its time to first token included)."""
    wall_s = ttft_s + (tokens - first_round) / decode_tps
    return {"new_tokens": tokens, "first_round_tokens": first_round, "ttft_s": ttft_s, "wall_s": wall_s,
            "tokens_per_second": tokens / wall_s}


def reply_rate(source: str, tps: float, context: int = 100, age_s: float = 0.0) -> S.BaselineRate:
    return S.BaselineRate.of_reply(reply_stats(tps), source, context, NOW - age_s)


# ---------------------------------------------------------------- where the baseline comes from


def test_nothing_measured_gives_no_rate_and_says_so():
    book = S.BaselineBook()
    assert book.choose("p", 100) is None
    assert S.baseline_label(None, NOW).startswith("no plain-decoding rate measured at a comparable prompt length")
    assert "–" in S.live_markdown({"tokens_per_second": 30.0}, None, None, NOW)


def test_order_reply_then_plain_steps_then_calibration():
    book = S.BaselineBook()
    calibration = reply_rate(S.CALIBRATION, 20.0)
    book.record("p", calibration)
    assert book.choose("p", 100) == calibration  # (3) the only one measured
    recorded_steps = S.BaselineRate.of_plain_step(0.040, 100, NOW - 60)
    book.record("p", recorded_steps)
    assert book.choose("p", 100) == recorded_steps  # (2) beats (3)
    live = S.BaselineRate.of_plain_step(0.045, 100, NOW)
    assert book.choose("p", 100, live_plain=live) == live  # this reply's own steps beat older ones
    side = reply_rate(S.SIDE_BY_SIDE, 23.1, age_s=120)
    book.record("p", side)
    assert book.choose("p", 100, live_plain=live) == side  # (1) a measured baseline reply beats all
    baseline = reply_rate(S.BASELINE_REPLY, 22.0, age_s=5)
    book.record("p", baseline)
    assert book.choose("p", 100) == baseline  # the latest baseline reply
    assert book.choose("other", 100) is None  # per preset


def test_a_baseline_at_another_context_length_falls_back():
    book = S.BaselineBook()
    book.record("p", reply_rate(S.SIDE_BY_SIDE, 23.0, context=100))
    book.record("p", reply_rate(S.BASELINE_REPLY, 15.0, context=2000))
    calibration = reply_rate(S.CALIBRATION, 24.0, context=40)
    book.record("p", calibration)
    assert book.choose("p", 300).tokens_per_second == 23.0  # within 256 tokens of 100
    assert book.choose("p", 1500).tokens_per_second == 15.0  # within a factor of 2 of 2000
    assert book.choose("p", 280) == book.choose("p", 100)  # the calibration comes after a reply
    assert book.choose("p", 800) is None  # nothing comparable, the calibration neither: no figure
    steps = S.BaselineRate.of_plain_step(0.05, 800, NOW)
    assert book.choose("p", 800, live_plain=steps) == steps
    only_calibration = S.BaselineBook()
    only_calibration.record("p", calibration)
    assert only_calibration.choose("p", 290) == calibration and only_calibration.choose("p", 1100) is None


def test_comparable_context_lengths():
    assert S.comparable(10, 266) and not S.comparable(10, 267)
    assert S.comparable(1000, 2000) and not S.comparable(1000, 2001)
    assert S.comparable(0, 5)


def test_unmeasured_rates_are_never_recorded():
    assert S.BaselineRate.of_reply({"new_tokens": 2, "wall_s": 0.1}, S.BASELINE_REPLY, 10, NOW) is None
    # four tokens, all in the first round: nothing after the first token to time
    assert S.BaselineRate.of_reply(reply_stats(20.0, tokens=5, first_round=5), S.BASELINE_REPLY, 10, NOW) is None
    assert S.BaselineRate.of_reply({"new_tokens": 50, "wall_s": 0.0}, S.BASELINE_REPLY, 10, NOW) is None
    assert S.BaselineRate.of_plain_step(None, 10, NOW) is None
    book = S.BaselineBook()
    book.record("p", None)
    assert book.choose("p", 10) is None and not book.has("p", S.CALIBRATION)


def test_labels_say_the_rate_its_source_and_its_age():
    side = reply_rate(S.SIDE_BY_SIDE, 23.1, age_s=150)
    assert S.baseline_label(side, NOW) == (
        "vs plain decoding 23.1 tok/s, measured in side-by-side 2 min ago (96 tokens in 4.16 s after the first)")
    assert "measured in a baseline reply just now" in S.baseline_label(reply_rate(S.BASELINE_REPLY, 20.0), NOW)
    step = S.BaselineRate.of_plain_step(0.04, 10, NOW - 30)
    assert S.baseline_label(step, NOW) == (
        "vs plain decoding 25.0 tok/s, measured from the engine's plain steps 30 s ago (a plain step 40 ms)")
    calibration = reply_rate(S.CALIBRATION, 30.0, age_s=7200)
    assert "measured by a calibration at load 2 h ago" in S.baseline_label(calibration, NOW)


@pytest.mark.parametrize("seconds, text", [(0, "just now"), (9.9, "just now"), (10, "10 s ago"), (59, "59 s ago"),
                                           (60, "1 min ago"), (3599, "59 min ago"), (3600, "1 h ago")])
def test_age_text(seconds, text):
    assert S.age_text(seconds) == text


# ---------------------------------------------------------------- rounds, theory, the live figure


def test_the_round_tally_folds_the_engines_record_of_rounds():
    # plain | 2 drafts kept + bonus | 1 of 2 kept, then resampled | 1 drafted, rejected
    counts = RoundTally.of([(0, 0), (2, 2), (2, 1), (1, 0)])
    assert counts == RoundTally(rounds=4, plain_rounds=1, drafted=5, rejections=2, accepted=3)


def test_prediction_uses_this_replys_acceptance_and_costs():
    counts = RoundTally(rounds=4, plain_rounds=1, rejections=2, accepted=3)
    stats = {"drafted_tokens": 6, "draft_s": 0.006}  # 1 ms a drafted token
    steps = {1: 0.040, 3: 0.044}
    prediction = S.predict(counts, stats, steps.get)
    assert prediction.a == pytest.approx(3 / 5)  # kept / (kept + rejections)
    assert prediction.g == 2.0 and prediction.share == 0.75
    assert prediction.c == pytest.approx(0.025) and prediction.v == pytest.approx(1.1)
    assert prediction.speedup == pytest.approx(predicted_speedup(0.6, 2.0, 0.025, 1.1, 0.75))


def test_a_reply_with_tree_rounds_is_predicted_from_its_per_node_acceptance():
    """Once a round verified a tree, the tokens per drafting round come from the per-node
    acceptance of the trees drafted (theory.expected_tree_tokens), not Leviathan's chain formula
    over the node count; the line names the model and the acceptance by depth."""
    from specdec_core.events import NodeAcceptance
    from specdec_core.theory import speedup_of_rounds

    nodes = NodeAcceptance()
    for path in ([0, 2], [1], [], [0]):
        nodes.add([-1, -1, 0, 0], path)  # 4 tree rounds of 4 nodes
    counts = RoundTally.of([(4, 2), (4, 1), (4, 0), (4, 1)])
    stats = {"drafted_tokens": 16, "draft_s": 0.016, "tree_rounds": 4}
    steps = {1: 0.040, 5: 0.056}
    prediction = S.predict(counts, stats, steps.get, nodes)
    assert prediction.tree_tokens == pytest.approx(2.0) == prediction.tokens
    assert prediction.by_depth == (0.75, 0.5) and prediction.g == 4.0
    assert prediction.speedup == pytest.approx(speedup_of_rounds(2.0, 4.0, 0.025, 1.4, 1.0))
    line = S.theory_line(prediction, None)
    assert line.startswith("Predicted (trees, per-node acceptance): ")
    assert "2.00 tokens per drafting round (acceptance by depth 0.75, 0.50), 4.0 nodes per round" in line
    # chains only (no tree round): Leviathan's formula as before
    chains = NodeAcceptance()
    chains.add_chain(2, 1)
    assert S.predict(counts, stats, steps.get, chains).tree_tokens is None


def test_no_prediction_before_a_drafting_round_or_a_measured_step():
    plain = RoundTally(rounds=3, plain_rounds=3, rejections=0, accepted=0)
    assert S.predict(plain, {"drafted_tokens": 0}, {1: 0.04}.get) is None
    drafted = RoundTally(rounds=2, plain_rounds=0, rejections=1, accepted=1)
    assert S.predict(drafted, {"drafted_tokens": 4, "draft_s": 0.0}, {}.get) is None


def test_live_markdown_shows_speedup_source_theory_and_efficiency():
    rate = reply_rate(S.SIDE_BY_SIDE, 20.0, age_s=120)
    prediction = S.Prediction(a=0.6, g=4.0, c=0.01, v=1.1, share=0.5, speedup=1.6)
    text = S.live_markdown(reply_stats(30.0), rate, prediction, NOW)
    assert text.startswith("**Speedup now: 1.50×** · 30.0 tok/s vs plain decoding 20.0 tok/s, measured in side-by-side 2 min ago")
    assert "Predicted (Leviathan et al.): 1.60× from a = 0.60, g = 4.0, c = 0.01, v = 1.10, 50% of rounds drafting" in text
    assert "efficiency 94% (measured / predicted)" in text
    assert "– until a round drafts" in S.live_markdown(reply_stats(30.0), rate, None, NOW)
    assert S.live_markdown(reply_stats(21.0), None, None, NOW, baseline_reply=True).startswith(
        "**Baseline reply** · plain decoding at 21.0 tok/s")
    assert "send a message" in S.live_markdown(None, None, None, NOW)


def test_speedup_now_is_the_decode_phase_ratio_whatever_the_prompt_reading():
    """A reply whose prompt came from the kept cache (TTFT 0.02 s) and one that read a long prompt
    (TTFT 4.5 s), both decoding at 30 tok/s after their first token, against a plain decode rate
    of 20 tok/s measured at a comparable length: the same 1.50x, the TTFT on its own line."""
    rate = reply_rate(S.BASELINE_REPLY, 20.0, context=1000)
    kept = reply_stats(30.0, ttft_s=0.02, tokens=48, first_round=3)
    long_read = reply_stats(30.0, ttft_s=4.5, tokens=48, first_round=3)
    assert kept["tokens_per_second"] > 25 and long_read["tokens_per_second"] < 10  # end to end they differ
    for stats, ttft in ((kept, "20 ms"), (long_read, "4.50 s")):
        text = S.live_markdown(stats, rate, None, NOW)
        head, reading = text.split("\n\n")[:2]
        assert head.startswith("**Speedup now: 1.50×** · 30.0 tok/s vs plain decoding 20.0 tok/s, measured in a baseline")
        assert "after the first token" in head
        assert reading == f"Time to first token: {ttft} (reading the prompt; not in the figure)"
    # before a second round there is no decode rate, so no figure however short the TTFT
    assert S.live_markdown(reply_stats(30.0, ttft_s=0.02, tokens=3, first_round=3), rate, None, NOW).startswith(
        "**Speedup now: –**")
    # no plain rate at a comparable prompt length: no figure, and the label says why
    far = S.BaselineBook()
    far.record("p", reply_rate(S.CALIBRATION, 20.0, context=40))
    text = S.live_markdown(long_read, far.choose("p", 1100), None, NOW)
    assert text.startswith("**Speedup now: –** · 30.0 tok/s · no plain-decoding rate measured at a comparable")


def test_theory_line_says_which_assumption_failed_above_the_prediction():
    prediction = S.Prediction(a=0.5, g=4.0, c=0.01, v=1.1, share=1.0, speedup=1.6)
    # 10 drafting rounds: 30 drafts kept, 10 rejections; 40 tokens per 10 rounds = 4.0 a round,
    # where independent acceptance at a = 0.5 over 4 drafts gives 1.94: streaks
    streaks = RoundTally(rounds=10, plain_rounds=0, rejections=6, accepted=30)
    rate = S.BaselineRate.of_plain_step(0.04, 100, NOW)  # the plain rate is the step's: no excess there
    stats = {"new_tokens": 40, "first_round_tokens": 4, "ttft_s": 0.1, "wall_s": 0.1 + 9 * 0.045}
    line = S.theory_line(prediction, 2.4, streaks, stats, rate, 0.04)
    assert "efficiency" not in line and "measured 2.40× is 50% above it" in line
    assert "acceptance came in streaks: 4.00 tokens per drafting round" in line and "give 1.94" in line
    # a plain rate below what one 1-token step implies is named too
    slow_plain = reply_rate(S.BASELINE_REPLY, 15.0)
    assert "plain decoding ran at 15.0 tok/s, below the 25.0 tok/s its 1-token step implies" in S.theory_line(
        prediction, 2.4, streaks, stats, slow_plain, 0.04)
    # within 10% of the prediction: the efficiency, even above 100%
    assert S.theory_line(prediction, 1.7, streaks, stats, rate, 0.04).endswith("efficiency 106% (measured / predicted)")
    # above it with no assumption seen failing: it says so rather than print an efficiency
    independent = RoundTally(rounds=10, plain_rounds=0, rejections=10, accepted=10)
    line = S.theory_line(prediction, 2.4, independent, {"new_tokens": 20, "ttft_s": 0.1, "wall_s": 1.0}, rate, 0.04)
    assert "none of its assumptions checked here failed" in line and "efficiency" not in line


def test_side_by_side_so_far():
    text = S.side_by_side_so_far(reply_stats(30.0, ttft_s=0.1), reply_stats(20.0, ttft_s=3.0))
    assert text.startswith("**Speedup so far: 1.50× decode phase** (speculative 30.0 tok/s vs baseline 20.0 tok/s")
    assert "–" in S.side_by_side_so_far(reply_stats(30.0), {"new_tokens": 0, "wall_s": 0.0})


# ---------------------------------------------------------------- the race chart


def test_race_points_start_after_the_prompt_reading():
    # a reply that read its prompt for 3 s, then decoded: its curve starts at 0 s with its first round
    assert S.race_point(reply_stats(20.0, ttft_s=3.0, tokens=21, first_round=1)) == (pytest.approx(1.0), 21)
    assert S.race_point({"new_tokens": 4, "first_round_tokens": 4, "ttft_s": 0.3, "wall_s": 0.3}) == (0.0, 4)


def test_race_frame_side_by_side_has_both_real_curves():
    frame = S.race_frame([(0.5, 10), (1.0, 24)], [(0.5, 8), (1.5, 24)])
    assert list(frame.columns) == ["seconds", "tokens", "run"]
    spec, base = frame[frame.run == S.SPECULATIVE_RUN], frame[frame.run == S.BASELINE_RUN]
    assert frame[frame.run == S.MEASURED_RATE_RUN].tokens.tolist() == [0]  # real runs: no rate line
    assert spec.values.tolist() == [[0.0, 0, "speculative"], [0.5, 10, "speculative"], [1.0, 24, "speculative"]]
    assert base.tokens.tolist() == [0, 8, 24]
    assert str(frame.seconds.dtype) == "float64" and str(frame.tokens.dtype) == "int64"


def test_race_frame_without_a_baseline_run_draws_the_measured_rate():
    frame = S.race_frame([(0.5, 10), (2.0, 60)], rate=reply_rate(S.CALIBRATION, 20.0))
    line = frame[frame.run == S.MEASURED_RATE_RUN]
    # from the origin's row to the reply's first point, then at the plain decode rate
    assert line.values.tolist() == [[0.0, 0, S.MEASURED_RATE_RUN], [0.0, 10, S.MEASURED_RATE_RUN],
                                    [2.0, 50, S.MEASURED_RATE_RUN]]
    assert S.MEASURED_RATE_RUN in S.RACE_DASHED_CSS and "stroke-dasharray" in S.RACE_DASHED_CSS
    only = S.race_frame([(0.5, 10)])  # nothing measured: the reply alone
    assert drawn(only) == {S.SPECULATIVE_RUN}
    assert drawn(S.race_frame([(0.5, 10)], spec_run=S.BASELINE_RUN)) == {S.BASELINE_RUN}


def drawn(frame) -> set[str]:
    """The series with a point besides the origin (a one-point line draws nothing)."""
    return set(frame[frame.tokens > 0].run)


def test_race_frames_always_hold_every_series_in_one_order():
    # The plot fixes its colour domain from its first frame: every frame names all three series.
    frames = [S.race_frame([]), S.race_frame([(0.5, 10)]), S.race_frame([], [(0.5, 8)]),
              S.race_frame([(0.5, 10)], rate=reply_rate(S.CALIBRATION, 20.0))]
    for frame in frames:
        assert list(dict.fromkeys(frame.run)) == list(S.RACE_COLOURS)


def test_throttle():
    times = iter([0.0, 0.1, 0.24, 0.26, 0.3, 0.6])
    throttle = S.Throttle(0.25, lambda: next(times))
    assert [throttle.due() for _ in range(6)] == [True, False, False, True, False, True]


# ---------------------------------------------------------------- the history


STATS = {**reply_stats(30.0, ttft_s=0.1, tokens=64, first_round=4), "drafted_tokens": 40, "acceptance_rate": 0.625,
         "tokens_per_target_forward": 1.8333}


def test_history_rows_and_csv(tmp_path):
    rate = reply_rate(S.SIDE_BY_SIDE, 20.0)
    spec = H.history_row(1, "Rewrite   this\nfunction with type hints and a long docstring please", "side by side",
                         "prompt lookup", STATS, rate)
    assert spec == {"#": 1, "prompt": "Rewrite this function with type hints a…", "mode": "side by side",
                    "drafter": "prompt lookup", "tokens": 64, "acceptance": 0.625, "tokens per target forward": 1.83,
                    "tokens/s": 30.5, "speedup": 1.5, "vs plain tok/s": 20.0, "baseline from": "side-by-side",
                    "TTFT s": 0.1, "decode tok/s": 30.0, "decode speedup": 1.5, "end-to-end speedup": ""}
    # side by side with its baseline half: both speedups against that half, whatever the book holds
    half = reply_stats(15.0, ttft_s=0.1, tokens=64)
    both = H.history_row(1, "hi", "side by side", "prompt lookup", STATS, None, base=half)
    assert both["decode speedup"] == both["speedup"] == 2.0 and both["vs plain tok/s"] == 15.0
    assert both["end-to-end speedup"] == round(STATS["tokens_per_second"] / half["tokens_per_second"], 2)
    assert both["baseline from"] == S.SIDE_BY_SIDE
    base = H.history_row(2, "hi", "baseline", "none", {**STATS, "drafted_tokens": 0}, rate)
    assert base["acceptance"] == "" and base["speedup"] == "" and base["baseline from"] == ""
    unmeasured = H.history_row(3, "hi", "speculative", "draft model", STATS, None)
    assert unmeasured["speedup"] == "" and unmeasured["acceptance"] == 0.625
    rows = [spec, base, unmeasured]
    assert H.history_frame(rows).shape == (3, len(H.HISTORY_COLUMNS))
    with open(H.write_history_csv(rows, str(tmp_path / "h.csv")), newline="") as file:
        read = list(csv.DictReader(file))
    assert [r["#"] for r in read] == ["1", "2", "3"] and read[0]["speedup"] == "1.5" and read[1]["speedup"] == ""
    assert list(read[0]) == H.HISTORY_COLUMNS
    assert H.HISTORY_COLUMNS[:11] == ["#", "prompt", "mode", "drafter", "tokens", "acceptance",  # old CSVs' columns
                                      "tokens per target forward", "tokens/s", "speedup", "vs plain tok/s",
                                      "baseline from"]


FORMULAS = ['=HYPERLINK("http://x","y")', "=1+1", "@SUM(1)", "+1+1", "-2+3", "\t=1+1", "\r\n=1+1",
            " \t =cmd|' /C calc'!A0"]


def test_formulas_in_prompts_are_neutralised_in_the_csv_and_read_back_as_text(tmp_path):
    prompts = [*FORMULAS, "plain text", "a = b + c"]
    rows = [H.history_row(n, prompt, "speculative", "prompt lookup", STATS, None) for n, prompt in enumerate(prompts, 1)]
    read = pd.read_csv(H.write_history_csv(rows, str(tmp_path / "h.csv")), dtype=str, keep_default_na=False)
    for row, prompt, cell in zip(rows, prompts, read["prompt"]):
        # The text as the table shows it (whitespace normalised), behind a ' where it would be a formula.
        assert cell == ("'" + row["prompt"] if prompt in FORMULAS else row["prompt"]), prompt
    assert not any(cell.startswith(H.FORMULA_STARTS) for column in read for cell in read[column])
    assert read["tokens"].tolist() == ["64"] * len(prompts) and read["#"].tolist()[:2] == ["1", "2"]


def test_reply_history_writes_its_own_file():
    history = H.ReplyHistory()
    history.add(H.history_row(1, "hi", "speculative", "prompt lookup", STATS, None))
    path = history.csv_file()
    assert path.endswith("reply-history.csv") and history.csv_file() == path
    assert H.ReplyHistory().csv_file() != path  # another session, another folder
    assert open(path).read().count("\n") == 2


def test_the_load_calibration_leaves_no_cache_behind_so_the_first_reply_reads_as_a_fresh_process(tiny_presets):
    """The calibration's plain reply shares the chat template's system prompt with every first
    message; were it kept, the first reply would read its prompt in other calls than the CLI or
    the API's first request do (and could part from them at a tie of two logits)."""
    from specdec_app.reply import calibrate
    from specdec_core import SamplingParams
    from specdec_core.chat import chat_prompt_ids
    from specdec_core.presets.loading import load_preset

    models = load_preset("tiny", tiny_presets.config)
    book = S.BaselineBook()
    calibrate(models, book)
    assert book.has("tiny", S.CALIBRATION)
    assert not any(models.cache_bytes().values())
    prompt = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": "List three colours of the rainbow."}])
    engine = models.engine(drafter="prompt_lookup")
    assert engine.generate(prompt, SamplingParams(max_new_tokens=8)).stats.prompt_tokens_read == len(prompt)
