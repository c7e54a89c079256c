"""`python -m specdec_core.gpu_check --tiny` (the bench's `gpu-check`): every part of the GPU check,
on the CPU with tiny configs, so the command a lent GPU machine runs never rots."""

from __future__ import annotations

import json

import pytest

from specdec_core import gpu_check as gpu_check_command
from specdec_core.bench import cli, gpu_check


def test_the_tiny_check_runs_every_part_and_writes_its_report(tmp_path):
    assert gpu_check_command.main(["--tiny", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    parts = {p["name"]: p for p in report["parts"]}
    assert list(parts) == list(gpu_check.PARTS)
    assert all(p["status"] == gpu_check.PASS for p in parts.values()), {n: p["reason"] for n, p in parts.items()}
    checks = {c["name"]: c for p in parts.values() for c in p["checks"]}
    for path in ("eager", "compiled"):  # lossless on this device, every drafter, both paths
        for drafter in ("model", "prompt_lookup"):
            assert checks[f"{drafter}, {path}: greedy == ours-baseline (fp32)"]["status"] == gpu_check.PASS
        for drafter in ("eagle", "medusa", "synthetic a=0.6"):  # trees, verified on the static cache's tree steps too
            assert checks[f"{drafter} trees, {path}: greedy == ours-baseline (fp32)"]["status"] == gpu_check.PASS
    assert checks["fp32 tree steps compiled"]["status"] == gpu_check.PASS
    assert checks["ours-baseline == HF generate (eager, fp32)"]["status"] == gpu_check.PASS
    # GPU-only targets are recorded as not run on the CPU, with what was measured
    assert checks["c <= 0.2 (compiled draft step / target step)"]["status"] == gpu_check.NOT_RUN
    assert parts["fast_path"]["data"]["cost_model"]["modes"]["compiled"]["target_path"] == "compiled static cache"
    assert parts["app"]["data"]["reply_s"] > 0 and parts["app"]["data"]["Tokens/s"]
    assert report["environment"]["torch"] and report["environment"]["cache_keyword"] in ("cache", "past_key_values")
    text = (tmp_path / "gpu_check.md").read_text()
    assert "| correctness | pass |" in text and "| app | pass |" in text
    assert (tmp_path / "cost_model.md").exists() and (tmp_path / "ceiling_free.md").exists()
    assert parts["eagle_cost"]["data"]["cost_model"]["eagle"]["step_ms"] > 0


def test_a_failing_part_is_recorded_and_the_rest_still_runs(tmp_path, monkeypatch):
    def broken(scale, part, shared, out):
        raise RuntimeError("no kernel image is available for execution on the device")

    def missing(scale, part, shared, out):
        return "bitsandbytes is not installed here"

    def fine(scale, part, shared, out):
        part.check("something", True, "measured")

    monkeypatch.setitem(gpu_check.PART_FUNCTIONS, "correctness", broken)
    monkeypatch.setitem(gpu_check.PART_FUNCTIONS, "loading", missing)
    monkeypatch.setitem(gpu_check.PART_FUNCTIONS, "app", fine)
    assert cli.main(["gpu-check", "--tiny", "--parts", "correctness,loading,app", "--out", str(tmp_path)]) == 1
    parts = {p["name"]: p for p in json.loads((tmp_path / "gpu_check.json").read_text())["parts"]}
    assert parts["correctness"]["status"] == gpu_check.FAIL and "no kernel image" in parts["correctness"]["reason"]
    assert "RuntimeError" in parts["correctness"]["data"]["traceback"]
    assert parts["loading"]["status"] == gpu_check.NOT_RUN and "bitsandbytes" in parts["loading"]["reason"]
    assert parts["app"]["status"] == gpu_check.PASS


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert gpu_check_command.main(["--tiny", "--parts", "warp", "--out", str(tmp_path)]) == 2
    assert "unknown parts warp" in capsys.readouterr().err


@pytest.mark.parametrize("vocab", [50, 1000])
def test_the_word_tokenizer_round_trips_and_has_a_chat_template(vocab):
    from specdec_core.chat import chat_prompt_ids

    tokenizer = gpu_check.word_tokenizer(vocab)
    ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": "w10 w11"}])
    assert 10 in ids and 11 in ids and max(ids) < vocab
    assert tokenizer.decode([10, 11]) == "w10 w11" and tokenizer.eos_token_id == 2
