"""The Medusa trainer (python -m specdec_core.train_medusa) on a tiny random target, in seconds:
the output folder's format, its labels' offsets, resumption, the shared data, the bad --out error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specdec_core import SamplingParams, SpeculativeEngine
from specdec_core.drafters import MedusaDrafter, MedusaHeads
from specdec_core.presets.loading import load_preset
from specdec_core.train.data import shard_path
from specdec_core.train.dataset import Sequence
from specdec_core.train.medusa import CHECKPOINT, MedusaSettings, head_targets, train_medusa
from specdec_core.train.medusa_cli import main
from tests.trainer_runs import QUICK_DATA, QUICK_TRAINING, flags, on_shared_data

OWN = dict(train_vocab=64, heads=2, top_k=3)  # the heads' own settings, small
QUICK = dict(**QUICK_DATA, **QUICK_TRAINING, **OWN, checkpoint_every=1)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, tiny_train_config, tiny_train_data) -> Path:
    """Heads trained on the shards the EAGLE trainer's tests train on too."""
    out = tmp_path_factory.mktemp("medusa-first") / "heads"
    train_medusa(_settings(tiny_train_config, out, tiny_train_data))
    return out


def _settings(tiny_train_config, out: Path, data: Path, **changes) -> MedusaSettings:
    return on_shared_data(MedusaSettings, tiny_train_config, out, data, **{**QUICK, **changes})


def test_the_output_folder_is_in_medusas_format_and_drafts(first_run, tiny_train_config):
    config = json.loads((first_run / "config.json").read_text())
    assert config["medusa_num_heads"] == 2 and config["medusa_num_layers"] == 1
    tensors = load_file(str(first_run / "medusa_lm_head.safetensors"))
    assert {name: tuple(t.shape) for name, t in tensors.items()} == {
        f"{i}.0.linear.{p}": shape for i in range(2) for p, shape in (("weight", (64, 64)), ("bias", (64,)))}
    assert all(t.dtype == torch.float16 for t in tensors.values())
    assert any(t.abs().sum() > 0 for t in tensors.values())  # trained away from the identity it starts as
    # The tokens the heads were trained to guess among, which the drafter reads out over.
    vocabulary = json.loads((first_run / "draft_vocab.json").read_text())["token_ids"]
    assert len(vocabulary) == OWN["train_vocab"] and vocabulary == sorted(vocabulary)
    assert MedusaHeads.load(first_run).draft_token_ids == vocabulary
    summary = json.loads((first_run / "training.json").read_text())
    held = summary["heldout"]
    assert len(held["top1"]) == len(held["top3"]) == len(held["chain_by_position"]) == 2
    assert all(0 <= a <= b <= 1 for a, b in zip(held["top1"], held["top3"]))
    assert held["chain_by_position"][1] <= held["chain_by_position"][0] <= held["top1"][0]
    assert summary["training"]["steps"] == summary["training"]["planned_steps"] > 0
    readme = (first_run / "README.md").read_text()
    assert "# Medusa heads for preset `tiny-train`" in readme and "| top-3 |" in readme
    # The folder loads as the drafter's heads, and drafting with them keeps the target's output.
    models = load_preset("tiny-train", str(tiny_train_config), load_draft=False)
    drafter = MedusaDrafter(MedusaHeads.load(first_run))
    engine = SpeculativeEngine(models.target, models.tokenizer, drafter=drafter, draft_length=2, adaptive=False)
    baseline = models.make_engine(drafter="none").generate([5, 6, 7], SamplingParams(max_new_tokens=8)).token_ids
    assert engine.generate([5, 6, 7], SamplingParams(max_new_tokens=8)).token_ids == baseline


def test_head_i_at_position_t_learns_reply_token_t_plus_2_plus_i():
    ids = torch.arange(100, 110)  # n = 10, the reply from index 4
    sequences = [Sequence(ids=ids, aux=torch.zeros(9, 3), final=torch.zeros(9, 2), reply_start=4, mode="greedy", family="qa")] * 2
    rows, labels = head_targets(sequences, 1)
    assert rows.tolist() == [1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 14, 15]  # the second sequence's rows start at 9
    assert labels.tolist() == [104, 105, 106, 107, 108, 109] * 2  # t + 3, reply tokens only


def test_a_killed_run_resumes_where_it_stopped_and_ends_as_an_uninterrupted_one(tmp_path, tiny_train_config, tiny_train_data):
    whole = train_medusa(_settings(tiny_train_config, tmp_path / "a" / "heads", tiny_train_data))
    settings = _settings(tiny_train_config, tmp_path / "b" / "heads", tiny_train_data)
    assert train_medusa(settings, stop_after=2) is None
    assert torch.load(Path(settings.work) / CHECKPOINT, weights_only=True)["progress"]["step"] == 2
    resumed = train_medusa(settings)
    assert resumed["training"]["steps"] == whole["training"]["steps"] > 2
    a = load_file(str(tmp_path / "a" / "heads" / "medusa_lm_head.safetensors"))
    b = load_file(str(tmp_path / "b" / "heads" / "medusa_lm_head.safetensors"))
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert resumed["heldout"] == whole["heldout"]


def test_the_eagle_trainers_data_is_used_as_it_is(tmp_path, tiny_train_config, tiny_train_data):
    """A work folder holding the EAGLE trainer's shards (same data settings): nothing is written
    again, and the checkpoint has a name of its own beside the EAGLE trainer's. (Its step runs
    autocast to bf16, --train-dtype bfloat16.)"""
    settings = _settings(tiny_train_config, tmp_path / "heads", tiny_train_data, train_dtype="bfloat16")
    written = shard_path(Path(settings.work) / "data", 0).stat().st_mtime_ns
    train_medusa(settings, stop_after=1)
    assert shard_path(Path(settings.work) / "data", 0).stat().st_mtime_ns == written
    assert (Path(settings.work) / "medusa_checkpoint.pt").is_file() and not (Path(settings.work) / "checkpoint.pt").exists()


def test_the_eagle_trainers_data_only_shards_of_varied_prompts_train_heads_as_they_are(tmp_path, tiny_train_config, capsys):
    """`train_eagle --data-only --prompts varied` writes the shards; train_medusa with the same data
    options (the same flags) trains on them without writing any: every shard holds the target's
    last hidden state the heads read, beside the EAGLE head's features."""
    from specdec_core.train.cli import main as eagle_main

    work = tmp_path / "work"
    data = ["--preset", "tiny-train", "--config", str(tiny_train_config), "--work", str(work), *flags(QUICK_DATA),
            "--prompts", "varied", "--threads", "1"]
    assert eagle_main([*data, "--out", str(tmp_path / "head"), "--data-only"]) == 0
    written = {path.name: path.stat().st_mtime_ns for path in (work / "data").iterdir()}
    assert main([*data, "--out", str(tmp_path / "heads"), *flags({**QUICK_TRAINING, **OWN})]) == 0
    assert "held-out top-1 accuracy by head" in capsys.readouterr().err
    assert {path.name: path.stat().st_mtime_ns for path in (work / "data").iterdir()} == written
    summary = json.loads((tmp_path / "heads" / "training.json").read_text())
    assert summary["settings"]["prompts"] == "varied" and summary["data"]["train_sequences"] > 0
    assert (tmp_path / "heads" / "medusa_lm_head.safetensors").is_file()


def test_bad_arguments_say_what_to_do_in_one_line(tmp_path, tiny_train_config, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert main(["--preset", "tiny-train", "--config", str(tiny_train_config), "--out", str(tmp_path / "taken")]) != 0
    assert main(["--preset", "tiny-train", "--config", str(tiny_train_config), "--out", str(tmp_path / "x"), "--heads", "0"]) != 0
    err = capsys.readouterr().err
    assert "holds something else (notes.txt)" in err and "--heads must be at least 1" in err
    assert "Traceback" not in err
