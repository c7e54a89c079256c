"""The ceiling run: a drafter with acceptance set by construction, and the engine measured against
Leviathan's prediction (python -m specdec_core.bench --ceiling)."""

from __future__ import annotations

import json

import pytest
import torch

from specdec_core.bench import ceiling, ceiling_report
from specdec_core.bench.synthetic import SyntheticDrafter, SyntheticTreeDrafter
from specdec_core.engine import SpeculativeEngine
from specdec_core.sampling import SamplingParams
from tests.tiny_models import tiny_llama


class _Numbers:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f" {i}" for i in ids)


def _proposals(a: float, draws: int = 400, k: int = 5) -> list[bool]:
    """Whether each proposed token was the reference one, over many proposals."""
    drafter = SyntheticDrafter(a, seed=7)
    drafter.bind(tiny_llama(seed=0, vocab=100), None)
    reference = list(range(10, 90))
    drafter.set_reference(reference, seed=1)
    right = []
    for i in range(draws):
        start = 5 + i % 60
        tokens = drafter.propose(reference[:start], k, SamplingParams(), torch.Generator()).tokens
        right += [t == reference[start + j] for j, t in enumerate(tokens)]
    return right


@pytest.mark.parametrize("a", [0.0, 0.3, 0.8, 1.0])
def test_each_drafted_token_is_right_with_probability_a(a):
    right = _proposals(a)
    share = sum(right) / len(right)
    assert abs(share - a) < 0.04  # 2000 draws: 4 standard deviations at a = 0.5


def test_it_drafts_nothing_past_the_reference_and_wrong_tokens_differ():
    drafter = SyntheticDrafter(0.0)
    drafter.bind(tiny_llama(seed=0, vocab=100), None)
    drafter.set_reference([1, 2, 3, 99])
    assert drafter.propose([1, 2], 5, SamplingParams(), torch.Generator()).tokens == [4, 0]  # (t + 1) mod V
    assert drafter.propose([1, 2, 3, 99], 5, SamplingParams(), torch.Generator()).tokens == []


def test_the_tree_drafter_gives_each_chain_token_a_sibling_holding_the_other_choice():
    chain = SyntheticDrafter(0.0)
    chain.bind(tiny_llama(seed=0, vocab=100), None)
    chain.set_reference([1, 2, 3, 4, 5])
    assert chain.propose_tree([1, 2], 3, 5, SamplingParams(), torch.Generator()).parents is None  # the ceiling's: chains
    drafter = SyntheticTreeDrafter(0.0)
    drafter.bind(tiny_llama(seed=0, vocab=100), None)
    drafter.set_reference([1, 2, 3, 4, 5])
    assert drafter.propose_tree([1, 2], 3, 0, SamplingParams(), torch.Generator()).parents is None  # no budget: the chain
    draft = drafter.propose_tree([1, 2], 3, 5, SamplingParams(), torch.Generator())
    # the chain 4, 5, 6 (all wrong: t + 1), then siblings holding the reference 3 and 4 while the budget lasts
    assert draft.tokens == [4, 5, 6, 3, 4] and draft.parents == [-1, 0, 1, -1, 0]
    right = SyntheticTreeDrafter(1.0)
    right.bind(tiny_llama(seed=0, vocab=100), None)
    right.set_reference([1, 2, 3, 4, 5])
    assert right.propose_tree([1, 2], 2, 4, SamplingParams(), torch.Generator()).tokens == [3, 4, 5, 6]  # decoys: t + 2


def test_greedy_tree_rounds_through_later_branches_give_the_baselines_tokens():
    target = tiny_llama(seed=2, vocab=300)
    target.generation_config.eos_token_id = None
    params = SamplingParams(max_new_tokens=30)
    prompt = list(range(40, 52))
    reference = SpeculativeEngine(target, _Numbers()).generate(prompt, params).token_ids
    drafter = SyntheticTreeDrafter(0.5, seed=1)
    engine = SpeculativeEngine(target, _Numbers(), drafter=drafter, draft_length=3, adaptive=False)
    drafter.set_reference(prompt + reference, seed=0)
    result = engine.generate(prompt, params, tree_nodes=6)
    assert result.token_ids == reference and result.stats.tree_rounds > 0
    kept = result.stats.node_acceptance.kept
    assert any(count for (depth, rank), count in kept.items() if rank > 0)  # a path left the first branch


def test_bad_settings_are_refused():
    for bad in (dict(acceptance=1.5), dict(acceptance=0.5, cost_s=-1), dict(acceptance=0.5, cost_mode="x")):
        with pytest.raises(ValueError):
            SyntheticDrafter(**bad)


@pytest.mark.parametrize("a", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("adaptive", [False, True])
def test_greedy_output_is_the_baselines_and_a_full_acceptance_keeps_every_draft(a, adaptive):
    target = tiny_llama(seed=2, vocab=300)
    target.generation_config.eos_token_id = None
    params = SamplingParams(max_new_tokens=30)
    prompt = list(range(40, 52))
    reference = SpeculativeEngine(target, _Numbers()).generate(prompt, params).token_ids
    drafter = SyntheticDrafter(a, cost_s=0.0)
    engine = SpeculativeEngine(target, _Numbers(), drafter=drafter, draft_length=3, adaptive=adaptive)
    drafter.set_reference(prompt + reference, seed=0)
    result = engine.generate(prompt, params)
    assert result.token_ids == reference
    rounds = result.stats.rounds
    assert sum(d for d, _ in rounds) == result.stats.drafted_tokens and len(rounds) >= 1
    if a == 1.0 and not adaptive:
        assert all(accepted == drafted == 3 for drafted, accepted in rounds[:-1])
    if a == 0.0:
        assert result.stats.accepted_tokens == 0


def test_ceiling_run_reports_every_setting_with_its_prediction(tmp_path):
    subject = ceiling.subject_from_architecture("tiny", prompts=2, prompt_tokens=12, max_new_tokens=20,
                                                progress=False)
    result = ceiling.run_ceiling(subject, acceptances=(0.5, 1.0), draft_lengths=(2, 4), max_new_tokens=20,
                                 progress=False)
    assert result["identical"] is True
    rows = {(r["acceptance"], r["setting"]): r for r in result["results"]}
    assert set(rows) == {(a, s) for a in (0.5, 1.0) for s in ("k=2", "k=4", "adaptive")}
    full = rows[1.0, "k=2"]
    assert full["measured_acceptance"] == 1.0
    assert full["tokens_per_target_forward"] > 2.5  # 3 a round, but the reply's end cuts the last ones short
    for row in rows.values():
        assert row["predicted_speedup"] > 0 and row["efficiency"] == pytest.approx(
            row["speedup"] / row["predicted_speedup"], rel=0.02)
        assert set(row["ms_per_round"]) == set(ceiling.PARTS)
        # the prediction at the acceptance the draws realised: at a = 1 every draw is right
        realised = row["measured_acceptance"]
        assert row["predicted_at_measured_acceptance"] == pytest.approx(
            ceiling._prediction(row["setting"], realised, row["c"], {int(g): v for g, v in result["costs"]["v"].items()})[1],
            rel=0.02)
        assert row["efficiency_at_measured_acceptance"] == pytest.approx(
            row["speedup"] / row["predicted_at_measured_acceptance"], rel=0.02)
    assert full["predicted_at_measured_acceptance"] == pytest.approx(full["predicted_speedup"], rel=0.02)
    assert set(result["costs"]["v"]) == {str(g) for g in range(1, 9)}
    paths = ceiling_report.write(tmp_path, result)
    assert [p.name for p in paths] == ["ceiling.json", "ceiling.md", "ceiling.png"]
    assert json.loads(paths[0].read_text())["results"]
    text = paths[1].read_text()
    assert "| 1 | k=2 |" in text and "Where a round's time goes at a = 1" in text and "efficiency at it" in text
    assert paths[2].stat().st_size > 1000


def test_the_ceiling_command_line(tmp_path, capsys):
    from specdec_core.bench.cli import main

    argv = ["--ceiling", "--target-config", "tiny", "--device", "cpu", "--prompts", "1", "--prompt-tokens", "8",
            "--max-new-tokens", "10", "--acceptance", "0.8", "--draft-lengths", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "| 0.8 | k=2 |" in capsys.readouterr().out and (tmp_path / "ceiling.png").exists()
    assert main(["--ceiling", "--target-config", "tiny", "--acceptance", "2", "--out", str(tmp_path)]) == 2
    assert "error: --acceptance takes values in [0, 1]" in capsys.readouterr().err
