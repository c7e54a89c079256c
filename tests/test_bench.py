"""The benchmark: the theory formula against hand-computed values, the round accounting, the
question sets, and a small run of `python -m specdec_core.bench` on tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec_core.bench import cli
from specdec_core.bench import run as bench
from specdec_core.bench.methods import LLAMACPP, METHODS, available_methods, rounds_from_trace, timed_run
from specdec_core.bench.runs import Run, RunTotals
from specdec_core.bench.questions import DEFAULT_QUESTIONS, FAMILIES, MT_BENCH_CATEGORIES, load_questions
from specdec_core.bench.theory_check import ProbedCosts, acceptance_probability, predicted_speedup
from specdec_core.theory import expected_tokens as expected_tokens_per_round
from specdec_core.theory import leviathan_speedup
from tests.tiny_models import require

SPEC_BENCH = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "spec_bench_questions.jsonl"
FIGURES = ("tokens_per_second", "speedup_vs_hf_generate", "speedup_vs_ours_baseline", "mean_accepted_tokens",
           "acceptance_rate", "identical_to_baseline", "ttft_s", "decode_tokens_per_second",
           "decode_speedup_vs_hf_generate", "decode_speedup_vs_ours_baseline")


# ---------------------------------------------------------------- theory (hand-computed values)


def test_expected_tokens_per_round_by_hand():
    assert expected_tokens_per_round(0.8, 4) == pytest.approx((1 - 0.32768) / 0.2)  # 3.3616
    assert expected_tokens_per_round(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    assert expected_tokens_per_round(0.0, 5) == 1.0  # only the target's own token
    assert expected_tokens_per_round(1.0, 3) == 4.0  # every draft plus the bonus


def test_leviathan_speedup_by_hand():
    assert leviathan_speedup(0.8, 4, c=0.1, v=1.2) == pytest.approx(3.3616 / 1.6)  # 2.101
    assert leviathan_speedup(0.5, 2, c=0.2, v=1.4) == pytest.approx(1.75 / 1.8)  # 0.9722: loses
    assert leviathan_speedup(0.0, 5, c=0.05) == pytest.approx(1 / 1.25)  # nothing accepted: 0.8
    assert leviathan_speedup(1.0, 3, c=0.0) == pytest.approx(4.0)  # free perfect drafts
    # The paper's own example (Table/Figure 3 setting): a = 0.7, g = 3, c = 0.05, v = 1.
    assert leviathan_speedup(0.7, 3, c=0.05) == pytest.approx((1 - 0.7**4) / 0.3 / 1.15)  # 2.2


def test_predicted_speedup_mixes_in_plain_rounds():
    # Half the rounds draft (a=0.8, g=4, c=0.1, v=1.2), half are plain steps.
    assert predicted_speedup(0.8, 4, 0.1, 1.2, draft_share=0.5) == pytest.approx(2.1808 / 1.3)
    assert predicted_speedup(0.8, 4, 0.1, 1.2, draft_share=1.0) == pytest.approx(leviathan_speedup(0.8, 4, 0.1, 1.2))
    assert predicted_speedup(0.3, 6, 0.9, 1.5, draft_share=0.0) == 1.0


def test_theory_rejects_impossible_inputs():
    with pytest.raises(ValueError):
        expected_tokens_per_round(1.5, 3)
    with pytest.raises(ValueError):
        leviathan_speedup(0.5, 3, c=-0.1)
    with pytest.raises(ValueError):
        predicted_speedup(0.5, 3, 0.1, 1.0, draft_share=2.0)


def test_acceptance_probability_ignores_tokens_after_a_rejection():
    counts = RunTotals()
    # Round 1: 4 drafted, 2 kept, then a rejection (the last token is never tried).
    # Round 2: 3 drafted, all kept. Round 3: plain.
    counts.add(Run("m", [0] * 8, 1.0, [(4, 2), (3, 3), (0, 0)]))
    assert acceptance_probability(counts) == pytest.approx(5 / 6)
    assert counts.accepted / counts.drafted == pytest.approx(5 / 7)  # the engine's acceptance_rate
    assert counts.plain_rounds == 1 and counts.rejections == 1 and counts.rounds == 3
    assert counts.drafted_by_position == [2, 2, 2, 1] and counts.accepted_by_position == [2, 2, 1, 0]


def test_decode_phase_leaves_the_first_token_out():
    """The bench's decode figures are the app's: tokens after each run's first round over the time
    after its first token; the speedups and the theory check compare them, not end-to-end rates."""
    from specdec_core.bench.report import summarize
    from specdec_core.bench.questions import Question

    counts = RunTotals()
    counts.add(Run("m", [0] * 21, 3.0, [(0, 0)] * 21, ttft_s=1.0, first_round_tokens=1))  # 20 tokens in 2 s
    counts.add(Run("m", [0] * 13, 1.5, [(4, 4)] + [(0, 0)] * 8, ttft_s=0.5, first_round_tokens=5))  # 8 in 1 s
    assert (counts.decode_tokens, counts.decode_s, counts.ttft_s, counts.runs) == (28, 3.0, 1.5, 2)
    # a long prompt read alike on both sides: 2x in the decode phase, far less end to end
    question = Question("q1", "qa", "qa", "hi")
    plain = Run("ours-baseline", [1] * 41, 4.0 + 40 / 10, [(0, 0)] * 41, ttft_s=4.0)
    fast = Run("ours-lookup", [1] * 41, 4.0 + 40 / 20, [(3, 3)] * 10 + [(0, 0)], ttft_s=4.0)
    runs = {("q1", "ours-baseline"): [plain], ("q1", "ours-lookup"): [fast]}
    costs = {"qa": ProbedCosts(context_tokens=10, target_step_s=0.1, verify_s={1: 0.1, 3: 0.1},
                               draft_step_s=None, lookup_s=0.0)}
    report = summarize([question], runs, ["ours-baseline", "ours-lookup"], True, costs)
    lookup = report["results"]["ours-lookup"]["qa"]
    assert lookup["decode_speedup_vs_ours_baseline"] == pytest.approx(2.0)
    assert lookup["speedup_vs_ours_baseline"] == pytest.approx(8.0 / 6.0)
    assert lookup["ttft_s"] == 4.0 and lookup["decode_tokens_per_second"] == pytest.approx(20.0)
    assert report["theory"]["ours-lookup"]["qa"]["measured_speedup"] == pytest.approx(2.0)


def test_theory_check_prices_our_drafting_by_the_time_the_engine_measured():
    """c of our methods is the drafting time timed during the runs (whatever the drafter: the
    EAGLE head's steps are no prompt-lookup search); methods that don't time it use the probes."""
    from specdec_core.bench.theory_check import theory_check

    costs = ProbedCosts(context_tokens=10, target_step_s=0.040, verify_s={1: 0.044, 2: 0.048},
                        draft_step_s=0.010, lookup_s=0.0001)
    ours = RunTotals()
    ours.add(Run("ours-eagle", [0] * 5, 1.0, [(2, 1), (2, 2)], draft_s=0.016))
    assert theory_check(ours, costs, False, 1.0)["c"] == pytest.approx(0.016 / 4 / 0.040)
    caught_up = RunTotals()  # the same time, 0.012 s of it reading what plain rounds left
    caught_up.add(Run("ours-eagle", [0] * 5, 1.0, [(2, 1), (2, 2)], draft_s=0.016, catch_up_s=0.012))
    check = theory_check(caught_up, costs, False, 1.0)
    assert check["c"] == pytest.approx(0.016 / 4 / 0.040) and check["c_catch_up"] == pytest.approx(0.012 / 4 / 0.040)
    probed = RunTotals()
    probed.add(Run("hf-lookup", [0] * 5, 1.0, [(2, 1), (2, 2)]))
    assert theory_check(probed, costs, False, 1.0)["c"] == pytest.approx(0.0001 / 0.040 / 2)
    assert theory_check(probed, costs, True, 1.0)["c"] == pytest.approx(0.010 / 0.040)
    ours.add(Run("hf-lookup", [0] * 5, 1.0, [(2, 1)]))  # one run without a measurement: probes
    assert theory_check(ours, costs, False, 1.0)["c"] == pytest.approx(0.0001 / 0.040 / 2)


def test_verify_ratio_interpolates_between_probed_lengths():
    costs = ProbedCosts(context_tokens=10, target_step_s=0.040, verify_s={1: 0.044, 3: 0.052},
                      draft_step_s=0.01, lookup_s=0.0)
    assert costs.verify_ratio(1) == pytest.approx(1.1)
    assert costs.verify_ratio(2) == pytest.approx(1.2)
    assert costs.verify_ratio(9) == pytest.approx(1.3)  # clamped to the longest probe


def test_tree_theory_by_hand():
    """Expected tokens of a tree: 1 + each node's chance of lying on the kept path, the product
    of the per-node rates (by depth and sibling rank) along it; a chain is the by-position case."""
    from specdec_core.theory import expected_tokens_by_position, expected_tree_tokens, rank_paths

    parents = [-1, -1, 0, 0, 1]  # two roots; the first has two children, the second one
    assert rank_paths(parents) == [(0,), (1,), (0, 0), (0, 1), (1, 0)]
    rates = {(1, 0): 0.5, (1, 1): 0.2, (2, 0): 0.4, (2, 1): 0.1}
    assert expected_tree_tokens(parents, rates) == pytest.approx(1 + 0.5 + 0.2 + 0.5 * 0.4 + 0.5 * 0.1 + 0.2 * 0.4)
    chain = {(1, 0): 0.9, (2, 0): 0.6, (3, 0): 0.5}
    assert expected_tree_tokens([-1, 0, 1], chain) == pytest.approx(expected_tokens_by_position([0.9, 0.6, 0.5]))
    assert expected_tree_tokens([-1, 0, 0], {(1, 0): 0.5}) == pytest.approx(1.5)  # places never measured: 0


def test_node_acceptance_counts_places_and_predicts_rounds_of_one_shape_exactly():
    """The per-node rates measured over rounds of one shape give back the measured tokens per
    round (the rates telescope); acceptance by depth is conditional on reaching the depth above."""
    from specdec_core.events import NodeAcceptance

    nodes = NodeAcceptance()
    parents = [-1, -1, 0, 0]  # two roots; the first has two children
    for path in ([0, 2], [1], [], [0]):
        nodes.add(parents, path)
    assert nodes.rates() == {(1, 0): 0.5, (1, 1): 0.25, (2, 0): 0.5, (2, 1): 0.0}
    assert nodes.expected_tokens() == pytest.approx(2.0) == nodes.measured_tokens()
    # depth 1: 3 of 4 rounds kept a root; depth 2: of the 2 that kept a root with children, 1 went on
    assert nodes.acceptance_by_depth() == [0.75, 0.5]
    chains = NodeAcceptance()
    chains.add_chain(3, 1)
    chains.add_chain(3, 3)
    assert chains.acceptance_by_depth() == [1.0, 0.5, 1.0] and chains.tree_rounds == 0
    assert chains.expected_tokens() == pytest.approx(3.0) == chains.measured_tokens()
    nodes.merge(chains)
    assert (nodes.rounds, nodes.tree_rounds, nodes.nodes) == (6, 4, 22)
    assert nodes.as_dict()["node_acceptance_by_depth_and_rank"]["1"] == [4 / 6, 0.25]


def test_theory_check_prices_tree_rounds_by_their_per_node_acceptance():
    """A method that verified trees is predicted from the tokens its per-node acceptance gives
    the trees it drafted, not from Leviathan's chain formula over its node count."""
    from specdec_core.bench.theory_check import TREE_MODEL, theory_check
    from specdec_core.events import NodeAcceptance
    from specdec_core.theory import speedup_of_rounds

    costs = ProbedCosts(context_tokens=10, target_step_s=0.040, verify_s={1: 0.044, 4: 0.056},
                        draft_step_s=None, lookup_s=0.0)
    nodes = NodeAcceptance()
    for path in ([0, 2], [1], [], [0]):
        nodes.add([-1, -1, 0, 0], path)
    tree = RunTotals()
    tree.add(Run("ours-medusa", [0] * 8, 1.0, [(4, 2), (4, 1), (4, 0), (4, 1)], draft_s=0.016, nodes=nodes))
    t = theory_check(tree, costs, False, 1.0)
    assert t["model"] == TREE_MODEL and t["g"] == 4.0
    assert t["expected_tokens_per_drafting_round"] == pytest.approx(2.0) == t["measured_tokens_per_drafting_round"]
    assert t["acceptance_by_depth"] == [0.75, 0.5]
    c, v = 0.016 / 16 / 0.040, 0.056 / 0.040
    assert t["predicted_speedup"] == pytest.approx(speedup_of_rounds(2.0, 4.0, c, v, 1.0))
    # the chain formula over 4 nodes kept at a = 0.5 (4 kept, 4 rejections) would have said otherwise
    assert t["predicted_speedup"] != pytest.approx(predicted_speedup(0.5, 4.0, c, v, 1.0))
    chain = RunTotals()
    chain.add(Run("ours-eagle", [0] * 5, 1.0, [(2, 1), (2, 2)], draft_s=0.016))
    assert theory_check(chain, costs, False, 1.0)["model"].startswith("chain")


# ---------------------------------------------------------------- round accounting


def test_rounds_from_an_engine_trace():
    # Prompt of 10 tokens: the engine prefills 9, then forwards [last, drafts...] each round.
    calls = [(0, 9), (9, 5), (12, 1), (13, 4)]  # (cached, new inputs)
    # Round 1: 4 drafted, sequence 10 -> 13: 2 kept. Round 2: plain. Round 3: 3 drafted,
    # final length 17 after starting at 14: 2 kept (the budget or an eos ended it).
    assert rounds_from_trace(calls, prompt_len=10, final_len=17) == [(4, 2), (0, 0), (3, 2)]


def test_rounds_from_a_hugging_face_trace():
    # HF's first forward runs the whole prompt (plus candidates when assisted).
    # Prompt 10: 2 candidates in the prefill, both kept (sequence 13); then 2 more, 1 kept
    # (sequence 15); then a plain step.
    calls = [(0, 12), (12, 3), (14, 1)]
    assert rounds_from_trace(calls, prompt_len=10, final_len=16) == [(2, 2), (2, 1), (0, 0)]


# ---------------------------------------------------------------- questions


def test_own_questions_cover_the_six_spec_bench_families():
    questions = load_questions()
    assert [f for f in FAMILIES if any(q.family == f for q in questions)] == list(FAMILIES)
    for family in FAMILIES:
        assert sum(q.family == family for q in questions) >= 3
    assert DEFAULT_QUESTIONS.parent.name == "data" and DEFAULT_QUESTIONS.parent.parent.name == "bench"


def test_own_categories_are_spec_bench_category_names():
    require(SPEC_BENCH.is_file(), f"{SPEC_BENCH} is not here")
    spec_bench = {q.category for q in load_questions(SPEC_BENCH)}
    assert {q.category for q in load_questions()} <= spec_bench
    assert set(MT_BENCH_CATEGORIES) <= spec_bench


def test_spec_bench_limit_is_per_family_and_spreads_over_mt_bench_categories():
    require(SPEC_BENCH.is_file(), f"{SPEC_BENCH} is not here")
    questions = load_questions(SPEC_BENCH, limit=5)
    assert len(questions) == 30
    conversation = [q for q in questions if q.family == "mt_bench"]
    assert len({q.category for q in conversation}) == 5
    assert [q.family for q in load_questions(SPEC_BENCH, ["rag", "writing"], 2)] == ["mt_bench", "mt_bench", "rag", "rag"]


def test_unknown_category_and_bad_file_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown categories poetry"):
        load_questions(None, ["poetry"])
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question_id": 1, "category": "qa"}\n')
    with pytest.raises(ValueError, match="line 1"):
        load_questions(bad)


# ---------------------------------------------------------------- a small run on tiny models


@pytest.fixture(scope="module")
def tiny_run(tiny_app_config, tmp_path_factory):
    """`python -m specdec_core.bench` on the tiny preset: 2 questions, 8 tokens, every method."""
    out = tmp_path_factory.mktemp("bench")
    code = cli.main([
        "--preset", "tiny", "--config", str(tiny_app_config), "--categories", "translation,rag",
        "--limit", "1", "--max-new-tokens", "8", "--repeats", "1", "--warmup-tokens", "2", "--out", str(out),
    ])
    return code, out


def test_small_run_writes_every_file_with_the_contract_keys(tiny_run):
    code, out = tiny_run
    assert code == 0
    for name in ("results.json", "results.md", "speedup.png", "acceptance.png"):
        assert (out / name).stat().st_size > 0
    for name in ("speedup.png", "acceptance.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((out / "results.json").read_text())
    for key in ("machine", "device", "versions", "preset", "settings", "results", "theory", "targets", "step_costs"):
        assert key in report, key
    assert report["preset"]["name"] == "tiny"
    assert {"torch", "transformers"} <= set(report["versions"])
    # llamacpp (where llama-cpp-python is installed) is left out: the tiny target is not a GGUF file
    compared = [m for m in available_methods() if m != LLAMACPP]
    assert list(report["results"]) == compared
    for method in compared:
        for category in ("translation", "rag", "overall"):
            figures = report["results"][method][category]
            assert set(FIGURES) <= set(figures), (method, category)
            assert figures["tokens_per_second"] > 0
            assert 0 < figures["ttft_s"] and figures["decode_tokens_per_second"] > 0, (method, category)
    assert report["settings"]["questions"] == 2
    markdown = (out / "results.md").read_text()
    for section in ("## Decode-phase speedup over ours-baseline", "## Decode tokens per second",
                    "## Time to first token"):
        assert section in markdown


def test_small_run_reports_the_bandwidth_ceiling_and_each_methods_share(tiny_run):
    _, out = tiny_run
    report = json.loads((out / "results.json").read_text())
    b = report["bandwidth"]
    assert b["weight_bytes_per_step"] > 0 and b["read_bandwidth_gbs"] > 0
    # read_bandwidth_gbs is rounded to 0.1 GB/s: on a busy machine (a few GB/s) that alone moves it by 2%
    rounding = 0.05 / b["read_bandwidth_gbs"]
    assert b["ceiling_tokens_per_s"] == pytest.approx(b["read_bandwidth_gbs"] * 1e9 / b["weight_bytes_per_step"],
                                                      rel=rounding + 0.001)
    assert set(b["share_of_ceiling"]) == set(report["results"])
    tps = report["results"]["ours-baseline"]["overall"]["tokens_per_second"]
    assert b["share_of_ceiling"]["ours-baseline"] == pytest.approx(tps / b["ceiling_tokens_per_s"], rel=0.01, abs=1e-3)
    assert "## Memory-bandwidth ceiling" in (out / "results.md").read_text()


def test_weight_bytes_per_step_count_what_each_layer_reads(tiny_app_config):
    """fp32 layers: their weights; prepacked: the same bytes; the tied embedding once, as the head."""
    from specdec_core.bench.machine import weight_bytes_read_per_step
    from specdec_core.kernels.packed_linear import pack_linear_layers
    from tests.tiny_models import tiny_llama

    model = tiny_llama(seed=0)
    embedding = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is embedding
    everything = sum(p.numel() * 4 for p in model.parameters()) + sum(b.numel() * b.element_size() for b in model.buffers())
    expected = everything if tied else everything - embedding.numel() * 4
    assert weight_bytes_read_per_step(model) == expected
    pack_linear_layers(model)
    assert weight_bytes_read_per_step(model) == expected


def test_llamacpp_is_a_method_only_where_llama_cpp_is_importable(tiny_app_config, tmp_path, capsys, monkeypatch):
    import importlib.util

    from specdec_core.bench import methods as bench_methods

    real_find_spec = importlib.util.find_spec
    if real_find_spec("llama_cpp") is None:
        assert "llamacpp" not in available_methods()
        problem = bench_methods.llamacpp_problem()
        assert "\n" not in problem and "pip install llama-cpp-python" in problem
        code = cli.main(["--preset", "tiny", "--config", str(tiny_app_config), "--out", str(tmp_path),
                           "--methods", "ours-baseline,llamacpp"])
        assert code == bench.EXIT_ERROR
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
        assert errors == [f"error: {problem}"]
    # simulated: as where llama-cpp-python is installed
    present = lambda name, *a: object() if name == "llama_cpp" else real_find_spec(name, *a)  # noqa: E731
    monkeypatch.setattr(bench_methods.importlib.util, "find_spec", present)
    assert bench_methods.llamacpp_problem() is None
    assert available_methods() == tuple(m for m in METHODS if m not in bench_methods.VLLM_METHODS)  # no vLLM asked
    # the default methods leave it out, with one line, for a target that is not a GGUF file
    capsys.readouterr()
    code = cli.main(["--preset", "tiny", "--config", str(tiny_app_config), "--out", str(tmp_path),
                       "--categories", "qa", "--limit", "1", "--max-new-tokens", "4", "--repeats", "1",
                       "--warmup-tokens", "0"])
    assert code == 0
    assert "llamacpp: the target " in capsys.readouterr().err
    assert "llamacpp" not in json.loads((tmp_path / "results.json").read_text())["results"]


def test_small_run_greedy_outputs_equal_the_baseline(tiny_run):
    code, out = tiny_run
    report = json.loads((out / "results.json").read_text())
    for method in ("ours-baseline", "ours-model", "ours-lookup", "ours-eagle", "ours-hybrid", "ours-medusa", "ours-layer-skip",
                   "ours-retrieval", "hf-generate"):
        assert report["identity"][method]["share"] == 1.0, method
    assert report["results"]["ours-baseline"]["overall"]["speedup_vs_ours_baseline"] == pytest.approx(1.0)


def test_small_run_reports_the_layer_skip_calibration(tiny_run):
    """ours-layer-skip's drafter calibrated as its engine was made: its choice and every subset's
    acceptance, cost and predicted speedup are in results.json and results.md."""
    _, out = tiny_run
    report = json.loads((out / "results.json").read_text())
    calibration = report["layer_skip_calibration"]
    assert calibration["layers"] == 2 and [p["kept"] for p in calibration["patterns"]] == [[0]]
    pattern = calibration["patterns"][0]
    assert 0 <= pattern["acceptance"] <= 1 and pattern["cost"] > 0 and pattern["speedup"] > 0
    assert calibration["kept"] == ([0] if calibration["chosen"] else [])
    assert report["results"]["ours-layer-skip"]["overall"]["tokens_per_second"] > 0
    markdown = (out / "results.md").read_text()
    assert "## Layer-skip calibration" in markdown and calibration["line"] in markdown
    assert "| early exit at 1/2 | 1 |" in markdown


def test_small_run_has_a_theory_check_per_speculative_method(tiny_run):
    _, out = tiny_run
    report = json.loads((out / "results.json").read_text())
    for method in ("ours-model", "ours-lookup", "ours-eagle", "ours-hybrid", "ours-medusa", "hf-assisted", "hf-lookup"):
        for category in ("translation", "rag"):
            t = report["theory"][method][category]
            assert t["predicted_speedup"] > 0 and t["efficiency"] > 0
    assert report["step_costs"]["rag"]["target_step_ms"] > 0
    markdown = (out / "results.md").read_text()
    assert "| ours-lookup |" in markdown and "Theory check" in markdown


def test_small_run_reports_acceptance_by_depth_and_the_tree_theory_line(tiny_run):
    """Tree methods: acceptance by depth, per-node acceptance, and the theory line from it (the
    tokens per drafting round it expects beside those measured); chains keep Leviathan's."""
    from specdec_core.bench.theory_check import CHAIN_MODEL, TREE_MODEL

    _, out = tiny_run
    report = json.loads((out / "results.json").read_text())
    for method in ("ours-eagle-tree", "ours-medusa"):
        figures = report["results"][method]["overall"]
        trees = figures["trees"]
        assert figures["tree_rounds"] == trees["tree_rounds"] > 0, method
        assert all(0 <= rate <= 1 for rate in figures["acceptance_by_depth"]) and figures["acceptance_by_depth"]
        assert 1 <= trees["expected_tokens_per_drafting_round"] <= 1 + trees["nodes_per_drafting_round"]
        for category in ("translation", "rag"):
            t = report["theory"][method][category]
            if report["results"][method][category]["tree_rounds"]:
                assert t["model"] == TREE_MODEL and t["predicted_speedup"] > 0, (method, category)
    assert report["results"]["ours-eagle"]["overall"]["trees"] is None
    assert report["theory"]["ours-eagle"]["rag"]["model"] == CHAIN_MODEL
    markdown = (out / "results.md").read_text()
    assert "## Trees: acceptance by depth and the tree theory line" in markdown
    assert "| ours-medusa | overall |" in markdown and "| ours-eagle |" not in markdown.split("## Trees")[1].split("##")[0]


def test_traced_rounds_agree_with_the_engine_stats(tiny_app_config):
    from specdec_core.bench.methods import HF_ASSISTED, HFMethod, OursMethod
    from specdec_core.presets.loading import load_preset
    from specdec_core.sampling import SamplingParams

    models = load_preset("tiny", tiny_app_config)
    prompt = list(range(100, 120)) * 3  # repetitive, so prompt lookup finds matches
    for drafter in ("model", "prompt_lookup"):
        method = OursMethod(drafter, models.make_engine(drafter=drafter, draft_length=3, adaptive=False))
        run = timed_run(method, prompt, SamplingParams(max_new_tokens=12))
        stats = method.engine.stats
        counts = RunTotals()
        counts.add(run)
        assert counts.rounds == stats.target_forwards - 1  # less the prefill
        assert (counts.drafted, counts.accepted) == (stats.drafted_tokens, stats.accepted_tokens)
        assert run.new_tokens == stats.new_tokens
        assert (run.ttft_s, run.first_round_tokens) == (stats.ttft_s, stats.first_round_tokens)
    # Hugging Face's generate: its first token when the first decoding forward returned
    hf = HFMethod(HF_ASSISTED, models.target, models.tokenizer, models.draft)
    run = timed_run(hf, prompt, SamplingParams(max_new_tokens=12))
    assert 0 < run.ttft_s < run.wall_s
    assert run.first_round_tokens == run.rounds[0][1] + 1 and run.decode_phase[0] == 12 - run.first_round_tokens


def test_engine_counted_rounds_equal_the_hook_trace_and_survive_compiled_steps(tiny_app_config):
    """Our methods take their rounds from the engine (Stats.rounds); on the eager path that is
    exactly what the forward hook traces, and on compiled steps, where hooks don't fire, it
    still counts every round."""
    from specdec_core.bench.methods import OursMethod, trace_forwards
    from specdec_core.engine import SpeculativeEngine
    from specdec_core.drafters import PromptLookupDrafter
    from specdec_core.presets.loading import load_preset
    from specdec_core.sampling import SamplingParams
    from specdec_core.decoding.static import StaticSteps

    models = load_preset("tiny", tiny_app_config)
    prompt, params = list(range(100, 120)) * 3, SamplingParams(max_new_tokens=12)
    eager = OursMethod("ours-lookup", models.make_engine(drafter="prompt_lookup", draft_length=3, adaptive=False))
    with trace_forwards(models.target) as calls:
        run = timed_run(eager, prompt, params)
    assert run.rounds == rounds_from_trace(calls, len(prompt), len(prompt) + run.new_tokens)
    steps = StaticSteps(models.target, step_sizes=(1, 4), max_length=128, backend="eager", progress=False)
    compiled = OursMethod("ours-lookup", SpeculativeEngine(models.target, models.tokenizer, PromptLookupDrafter(),
                                                           draft_length=3, adaptive=False, make_runner=steps))
    compiled_run = timed_run(compiled, prompt, params)
    assert steps.decode_path == "compiled static cache"
    assert compiled_run.rounds == run.rounds and compiled_run.token_ids == run.token_ids


def test_a_mismatch_of_our_method_exits_non_zero(tiny_app_config, tmp_path, monkeypatch):
    from specdec_core.bench import methods as bench_methods

    real = bench_methods.OursMethod.generate

    def corrupted(self, prompt_ids, params):
        tokens = real(self, prompt_ids, params)
        return tokens[:-1] + [tokens[-1] + 1] if self.name == "ours-lookup" else tokens

    monkeypatch.setattr(bench_methods.OursMethod, "generate", corrupted)
    code = cli.main([
        "--preset", "tiny", "--config", str(tiny_app_config), "--categories", "qa", "--limit", "1",
        "--max-new-tokens", "4", "--repeats", "1", "--warmup-tokens", "0",
        "--methods", "ours-baseline,ours-lookup", "--out", str(tmp_path),
    ])
    assert code == bench.EXIT_MISMATCH
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["identity"]["ours-lookup"]["share"] == 0.0


def test_bad_flags_are_one_line_errors(tiny_app_config, tmp_path, capsys):
    for flags in (["--methods", "ours-turbo"], ["--categories", "poetry"], ["--repeats", "0"]):
        code = cli.main(["--preset", "tiny", "--config", str(tiny_app_config), "--out", str(tmp_path), *flags])
        assert code == bench.EXIT_ERROR
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1


# ---------------------------------------------------------------- one command, four subcommands


def test_the_bench_is_one_command_with_four_subcommands(tmp_path, capsys):
    """`python -m specdec_core.bench run | ceiling | cost-model | gpu-check`: each reaches its own
    module, which rejects a bad flag in one line (exit 2) before loading anything."""
    with pytest.raises(SystemExit) as ended:
        cli.main(["--help"])
    assert ended.value.code == 0
    assert "{run,ceiling,cost-model,gpu-check}" in capsys.readouterr().out
    cases = {
        ("run", "--preset", "tiny", "--methods", "warp"): "unknown methods warp",
        ("ceiling", "--target-config", "tiny", "--acceptance", "2"): "--acceptance takes values in [0, 1]",
        ("cost-model", "--target-config", "gpt-9", "--device", "cpu"): "unknown architecture 'gpt-9'",
        ("gpu-check", "--tiny", "--parts", "warp"): "unknown parts warp",
    }
    for argv, error in cases.items():
        assert cli.main([*argv, "--out", str(tmp_path / "out")]) == bench.EXIT_ERROR
        assert error in capsys.readouterr().err
    # today's spellings: no subcommand is run, --ceiling and --cost-model pick theirs
    assert cli.main(["--preset", "tiny", "--methods", "warp", "--out", str(tmp_path)]) == bench.EXIT_ERROR
    assert "unknown methods warp" in capsys.readouterr().err
    assert cli.main(["--target-config", "gpt-9", "--cost-model", "--device", "cpu"]) == bench.EXIT_ERROR
    assert "unknown architecture 'gpt-9'" in capsys.readouterr().err


def test_python_m_bench_lists_its_subcommands():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "specdec_core.bench", "--help"], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0 and "{run,ceiling,cost-model,gpu-check}" in done.stdout


def test_architectures_are_data_read_as_numbers():
    """data/architectures.yaml: the published sizes, as numbers (YAML 1.1 reads `1e6` as a string)."""
    from specdec_core.bench.architectures import ARCHITECTURES, load_architecture

    qwen = load_architecture("qwen2.5-7b")
    assert (qwen["hidden_size"], qwen["num_hidden_layers"], qwen["vocab_size"]) == (3584, 28, 152064)
    assert qwen["rope_theta"] == 1e6 and qwen["rms_norm_eps"] == 1e-6 and qwen["tie_word_embeddings"] is False
    numbers = [v for config in ARCHITECTURES.values() for k, v in config.items() if k != "model_type"]
    assert all(isinstance(v, (int, float)) for v in numbers)
    with pytest.raises(ValueError, match="unknown architecture 'gpt-9'"):
        load_architecture("gpt-9")


def test_ours_eagle_tree_verifies_trees_and_counts_acceptance_by_depth(tiny_app_config):
    """ours-eagle-tree hands the engine no tree bound (the policy sizes trees), ours-eagle 0
    (chains only); a tree round fills depths 1..its depth, not one position per node."""
    from specdec_core.bench.methods import OURS_EAGLE, OURS_EAGLE_TREE, make_methods
    from specdec_core.presets.loading import load_preset
    from specdec_core.sampling import SamplingParams

    assert OURS_EAGLE_TREE in METHODS
    models = load_preset("tiny", tiny_app_config)
    chain, tree = make_methods([OURS_EAGLE, OURS_EAGLE_TREE], models)
    prompt = list(range(100, 120)) * 3
    chain_run = timed_run(chain, prompt, SamplingParams(max_new_tokens=12))
    assert chain.engine.stats.tree_rounds == 0
    tree_run = timed_run(tree, prompt, SamplingParams(max_new_tokens=12))
    stats = tree.engine.stats
    assert tree_run.token_ids == chain_run.token_ids  # greedy: both are plain decoding's reply
    assert stats.tree_rounds > 0 and stats.tree_nodes_verified > stats.tree_rounds
    counts = RunTotals()
    counts.add(tree_run)
    assert counts.drafted_by_position == stats.drafted_by_position
    assert len(counts.drafted_by_position) <= max(drafted for drafted, _ in tree_run.rounds)
    assert counts.drafted_by_position[0] == sum(1 for drafted, _ in tree_run.rounds if drafted)
    assert counts.nodes.tree_rounds == stats.tree_rounds and chain_run.nodes.tree_rounds == 0


def test_ours_medusa_verifies_candidate_trees(tiny_app_config):
    """ours-medusa verifies its heads' candidate trees (sized by the policy), greedy reply unchanged."""
    from specdec_core.bench.methods import OURS_BASELINE, OURS_MEDUSA, make_methods
    from specdec_core.presets.loading import load_preset
    from specdec_core.sampling import SamplingParams

    models = load_preset("tiny", tiny_app_config)
    plain, medusa = make_methods([OURS_BASELINE, OURS_MEDUSA], models)
    prompt = list(range(100, 120)) * 3
    run = timed_run(medusa, prompt, SamplingParams(max_new_tokens=12))
    assert run.token_ids == timed_run(plain, prompt, SamplingParams(max_new_tokens=12)).token_ids
    assert medusa.engine.stats.tree_rounds > 0 and run.nodes.tree_rounds == medusa.engine.stats.tree_rounds
