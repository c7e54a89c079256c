"""The EAGLE-3 trainer (python -m specdec_core.train_eagle) on a tiny random target, in seconds:
the output folder's format, resumption, determinism under --seed, and the bad --out error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specdec_core.drafters.eagle_head import Eagle3Head
from specdec_core.presets.loading import load_preset
from specdec_core.train.cli import main
from specdec_core.train.data import shard_path
from specdec_core.train.trainer import CHECKPOINT, TrainSettings, train
from tests.tiny_models import tiny_llama
from tests.trainer_runs import QUICK_DATA, QUICK_TRAINING, flags, on_shared_data

QUICK = dict(**QUICK_DATA, **QUICK_TRAINING, draft_vocab=64, ttt_steps=2, checkpoint_every=1)  # a 64-token draft vocabulary
QUICK_ARGS = flags({**QUICK_DATA, **QUICK_TRAINING, "draft_vocab": 64, "ttt_steps": 2})


@pytest.fixture(scope="module")
def data_work(tmp_path_factory, tiny_train_config, tiny_train_data) -> Path:
    """A head trained on the shared data shards, as the other runs are (same data settings)."""
    out = tmp_path_factory.mktemp("first") / "head"
    train(_settings(tiny_train_config, out, tiny_train_data))
    return out


def _settings(tiny_train_config, out: Path, data: Path, **changes) -> TrainSettings:
    return on_shared_data(TrainSettings, tiny_train_config, out, data, **{**QUICK, **changes})


def test_the_output_folder_is_an_eagle3_head(data_work, tiny_train_config):
    config = json.loads((data_work / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
                "rope_theta", "vocab_size", "draft_vocab_size", "max_position_embeddings"):
        assert key in config, key
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == 64 and config["vocab_size"] == 49152
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 1, 0]  # 2, L//2, L-3 for L = 2, clamped into the model
    tensors = load_file(str(data_work / "model.safetensors"))
    H, inter = 64, 128
    expected = {
        "fc.weight": (H, 3 * H),
        "midlayer.input_layernorm.weight": (H,), "midlayer.hidden_norm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (64, 2 * H), "midlayer.self_attn.k_proj.weight": (32, 2 * H),
        "midlayer.self_attn.v_proj.weight": (32, 2 * H), "midlayer.self_attn.o_proj.weight": (H, 64),
        "midlayer.post_attention_layernorm.weight": (H,),
        "midlayer.mlp.gate_proj.weight": (inter, H), "midlayer.mlp.up_proj.weight": (inter, H),
        "midlayer.mlp.down_proj.weight": (H, inter),
        "norm.weight": (H,), "lm_head.weight": (64, H), "d2t": (64,), "t2d": (49152,),
    }
    assert {name: tuple(t.shape) for name, t in tensors.items()} == expected
    assert not any("embed_tokens" in name for name in tensors)
    assert tensors["fc.weight"].dtype == torch.float16 and tensors["t2d"].dtype == torch.bool
    assert int(tensors["t2d"].sum()) == 64
    ids = torch.arange(64) + tensors["d2t"]  # draft id -> target id
    assert torch.equal(tensors["t2d"].nonzero().flatten(), ids)
    head = Eagle3Head.load(data_work)  # the head module reads it
    assert head.draft_vocab_size == 64
    summary = json.loads((data_work / "training.json").read_text())
    acceptance = summary["heldout_acceptance"]
    assert len(acceptance["by_position"]) == 4 and acceptance["chains"] > 0
    assert all(a >= b for a, b in zip(acceptance["by_position"], acceptance["by_position"][1:]))
    assert len(summary["learning_curve"]) >= 3
    assert "Held-out acceptance" in (data_work / "README.md").read_text()


def test_a_killed_run_resumes_where_it_stopped_and_ends_as_an_uninterrupted_one(tmp_path, tiny_train_config, tiny_train_data):
    whole = train(_settings(tiny_train_config, tmp_path / "a" / "head", tiny_train_data))
    settings = _settings(tiny_train_config, tmp_path / "b" / "head", tiny_train_data)
    assert train(settings, stop_after=2) is None  # "killed" after 2 steps
    assert torch.load(Path(settings.work) / CHECKPOINT, weights_only=True)["progress"]["step"] == 2
    resumed = train(settings)
    assert resumed["training"]["steps"] == whole["training"]["steps"] > 2
    a = load_file(str(tmp_path / "a" / "head" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "head" / "model.safetensors"))
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert resumed["heldout_acceptance"] == whole["heldout_acceptance"]


def test_the_same_seed_gives_the_same_head_and_another_seed_another(tmp_path, tiny_train_config, tiny_train_data, data_work):
    first = load_file(str(data_work / "model.safetensors"))
    train(_settings(tiny_train_config, tmp_path / "same" / "head", tiny_train_data))
    same = load_file(str(tmp_path / "same" / "head" / "model.safetensors"))
    assert all(torch.equal(first[name], same[name]) for name in first)
    # Another seed writes other data (its prompts), so it gets a work folder of its own.
    train(TrainSettings("tiny-train", str(tmp_path / "other" / "head"), config=str(tiny_train_config), **{**QUICK, "seed": 1}))
    other = load_file(str(tmp_path / "other" / "head" / "model.safetensors"))
    assert not torch.equal(first["fc.weight"], other["fc.weight"])


class _Planted:
    """What a malicious checkpoint holds: unpickling it would run `touch <marker>`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_planted_pickle_checkpoint_is_refused_without_running_it(tmp_path, tiny_train_config, tiny_train_data):
    settings = _settings(tiny_train_config, tmp_path / "d" / "head", tiny_train_data)
    marker = tmp_path / "the-pickle-ran"
    torch.save({"settings": settings.fingerprint(), "progress": _Planted(marker)}, Path(settings.work) / CHECKPOINT)
    with pytest.raises(ValueError, match="holds more than tensors.*delete it") as caught:
        train(settings)
    assert not marker.exists(), "resuming ran code from the checkpoint"
    assert "\n" not in str(caught.value) and "weights_only=False" not in str(caught.value)
    (Path(settings.work) / CHECKPOINT).unlink()
    assert train(settings, stop_after=1) is None  # a checkpoint of its own loads with weights_only
    assert train(settings, stop_after=2) is None


def test_resuming_with_other_settings_says_so(tmp_path, tiny_train_config, tiny_train_data):
    settings = _settings(tiny_train_config, tmp_path / "c" / "head", tiny_train_data)
    train(settings, stop_after=1)
    with pytest.raises(ValueError, match="other settings \\(lr\\)"):
        train(_settings(tiny_train_config, tmp_path / "c" / "head", tiny_train_data, lr=0.5))


def test_bf16_data_is_written_by_the_targets_own_weights_in_bf16_and_trains_a_head(tmp_path, tiny_train_config):
    from specdec_core.train.trainer import data_model

    settings = TrainSettings("tiny-train", str(tmp_path / "head"), config=str(tiny_train_config), data_dtype="bfloat16",
                             train_dtype="bfloat16", **QUICK)
    target = load_preset("tiny-train", str(tiny_train_config), load_draft=False).target
    writer = data_model(settings, target)
    assert writer is not target and writer.dtype == torch.bfloat16
    layer = writer.model.layers[0].self_attn.q_proj
    assert type(layer) is torch.nn.Linear  # stock layers, not the decoding path's packed ones
    plain = target.get_input_embeddings().weight  # fp32 (packing keeps the embedding's weight)
    assert target.dtype == torch.float32
    assert torch.equal(writer.get_input_embeddings().weight, plain.to(torch.bfloat16))
    assert data_model(TrainSettings("tiny-train", "x", config=str(tiny_train_config)), target) is target

    summary = train(settings)
    assert summary["settings"]["data_dtype"] == summary["settings"]["train_dtype"] == "bfloat16"
    assert summary["heldout_acceptance"]["chains"] > 0
    features = torch.load(Path(settings.work_dir) / "data" / "shard-00000.pt")
    assert features[0]["aux"].dtype == torch.float16 and features[0]["aux"].shape[-1] == 3 * 64
    readme = (tmp_path / "head" / "README.md").read_text()
    assert "weights in bf16" in readme and "autocast to bf16" in readme and "written again by the target" in readme


def test_with_cheaper_data_the_head_is_measured_on_replies_the_target_itself_wrote(tmp_path, tiny_train_config):
    from specdec_core.train.data import read_shard
    from specdec_core.train.features import sequence_features

    settings = TrainSettings("tiny-train", str(tmp_path / "head"), config=str(tiny_train_config), data_dtype="bfloat16", **QUICK)
    summary = train(settings)
    work = Path(settings.work_dir)
    written, rewritten = (read_shard(work / folder / "shard-00001.jsonl") for folder in ("data", "heldout_by_target"))
    assert [row["prompt_ids"] for row in rewritten] == [row["prompt_ids"] for row in written]  # shard 1 is held out
    assert summary["data"]["evaluated_sequences"] == sum(len(row["reply_ids"]) >= 3 for row in rewritten)
    target = load_preset("tiny-train", str(tiny_train_config), load_draft=False).target
    stored = torch.load(work / "heldout_by_target" / "shard-00001.pt")
    row, feature = rewritten[0], stored[0]
    aux, _ = sequence_features(target, (row["prompt_ids"] + row["reply_ids"])[:-1], Eagle3Head.load(tmp_path / "head").layer_ids)
    assert torch.allclose(feature["aux"].float(), aux.float(), atol=2e-2, rtol=1e-2)  # the target's own features
    bf16 = torch.load(work / "data" / "shard-00001.pt")[0]["aux"].float()
    assert not torch.allclose(bf16[: len(aux)], aux.float(), atol=2e-3, rtol=0) or len(bf16) != len(aux)


def test_a_run_stopped_by_max_minutes_and_started_again_writes_the_same_head(tmp_path, tiny_train_config, tiny_train_data):
    settings = _settings(tiny_train_config, tmp_path / "head", tiny_train_data, max_minutes=0.0)
    first = train(settings)
    assert first["training"]["stopped_early"] and first["training"]["steps"] == 1
    weights = load_file(tmp_path / "head" / "model.safetensors")
    again = train(settings)
    assert again["training"]["steps"] == 1
    assert all(torch.equal(weights[name], tensor) for name, tensor in load_file(tmp_path / "head" / "model.safetensors").items())


def test_an_out_folder_holding_something_else_is_refused_in_one_line(tmp_path, tiny_train_config, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["--preset", "tiny-train", "--config", str(tiny_train_config), "--out", str(out), *QUICK_ARGS]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: --out") and "notes.txt" in error and len(error.splitlines()) == 1
    assert (out / "notes.txt").read_text() == "mine"
    file = tmp_path / "a-file"
    file.write_text("x")
    assert main(["--preset", "tiny-train", "--config", str(tiny_train_config), "--out", str(file), *QUICK_ARGS]) == 2
    assert "is a file" in capsys.readouterr().err


def test_data_of_another_recipe_is_refused_before_anything_is_written(tmp_path, tiny_train_config, tiny_train_data):
    settings = _settings(tiny_train_config, tmp_path / "d" / "head", tiny_train_data, passages="mixed", shards=3)
    with pytest.raises(ValueError, match="data shards written with other settings \\(passages\\)"):
        train(settings)
    assert not shard_path(Path(settings.work) / "data", 2).exists()


def test_the_entry_point_runs_as_a_module(tmp_path, tiny_train_config, tiny_train_data):
    work = tmp_path / "work"
    work.mkdir()
    (work / "data").symlink_to(tiny_train_data)
    out = tmp_path / "head"
    done = subprocess.run(
        [sys.executable, "-m", "specdec_core.train_eagle", "--preset", "tiny-train", "--config", str(tiny_train_config),
         "--out", str(out), "--work", str(work), *QUICK_ARGS, "--threads", "1"],
        capture_output=True, text=True, timeout=1200,  # generous: the shared CI machine may be busy
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "held-out acceptance by position" in done.stderr
    assert (out / "model.safetensors").exists() and (out / "README.md").exists()


def test_data_only_writes_the_shards_and_stops_and_the_same_command_then_trains_on_them(tmp_path, tiny_train_config, capsys):
    out, work = tmp_path / "head", tmp_path / "work"
    args = ["--preset", "tiny-train", "--config", str(tiny_train_config), "--out", str(out), "--work", str(work),
            *QUICK_ARGS, "--prompts", "varied", "--threads", "1"]
    assert main([*args, "--data-only"]) == 0
    assert "wrote the data shards" in capsys.readouterr().err
    assert shard_path(work / "data", 1).exists() and not (out / "model.safetensors").exists()
    assert not (work / CHECKPOINT).exists()
    written = shard_path(work / "data", 0).stat().st_mtime_ns
    assert main(args) == 0  # the data is on disk: only the training runs
    assert shard_path(work / "data", 0).stat().st_mtime_ns == written and (out / "model.safetensors").exists()


def test_the_training_time_test_computes_what_drafting_step_by_step_computes():
    """Every chain's step j in the unrolled training forward equals drafting it one token at a
    time with the head's KV cache: real entries up to t, then the head's own outputs."""
    from transformers import DynamicCache

    from specdec_core.train.dataset import Batch
    from specdec_core.train.ttt import Chains, chain_outputs

    target = tiny_llama(seed=1, vocab=300)
    head = Eagle3Head.random(target.config, draft_vocab_size=50, layer_ids=(1, 1, 0), seed=3).float()
    generator = torch.Generator().manual_seed(0)
    n, steps = 12, 3
    ids = torch.randint(0, 300, (1, n + steps + 1), generator=generator)
    batch = Batch(ids=ids, aux=torch.randn(1, n, 3 * 64, generator=generator).half(),
                  final=torch.zeros(1, n + steps, 64, dtype=torch.float16),
                  lengths=torch.tensor([n + 1]), reply_starts=torch.tensor([1]))
    embed = target.get_input_embeddings()
    with torch.no_grad():
        outputs = chain_outputs(head, embed, batch, steps, Chains(first=torch.tensor([0]), count=torch.tensor([n])))
        for t in (0, 4, n - 1):
            cache = DynamicCache()
            hidden = head(embed(ids[:, 1 : t + 2]), head.project(batch.aux[:, : t + 1]), cache=cache)[:, -1:]
            torch.testing.assert_close(hidden[0, 0], outputs[0][t], rtol=1e-5, atol=1e-5)
            for step in range(2, steps + 1):
                hidden = head(embed(ids[:, t + step : t + step + 1]), hidden, cache=cache)
                torch.testing.assert_close(hidden[0, 0], outputs[step - 1][t], rtol=1e-5, atol=1e-5)


def _random_sequences(generator, lengths_and_starts, vocab: int, hidden: int):
    from specdec_core.train.dataset import Sequence

    return [Sequence(ids=torch.randint(0, vocab, (n,), generator=generator),
                     aux=torch.randn(n - 1, 3 * hidden, generator=generator).half(),
                     final=(torch.randn(n - 1, hidden, generator=generator) * 3).half(),
                     reply_start=start, mode="t1.0", family="random")
            for n, start in lengths_and_starts]


def _loss_chain_by_chain(head, embed, draft_lm_head, sequences, steps):
    """The training-time test's loss and report as the drafter computes it: every trained chain
    drafted on its own, one token at a time with the head's KV cache."""
    from transformers import DynamicCache

    from specdec_core.train.ttt import STEP_WEIGHT

    losses, agree = {j: [] for j in range(1, steps + 1)}, {j: [] for j in range(1, steps + 1)}
    for s in sequences:
        last = len(s.ids) - 2  # the last position with the target's features
        for t in range(max(s.reply_start - 1, 0), last):
            cache = DynamicCache()
            hidden = head(embed(s.ids[None, 1 : t + 2]), head.project(s.aux[None, : t + 1]), cache=cache)[:, -1:]
            for step in range(1, min(steps, last - t) + 1):
                if step > 1:
                    hidden = head(embed(s.ids[None, t + step : t + step + 1]), hidden, cache=cache)
                log_q = torch.log_softmax(head.logits(hidden[0, 0]).float(), -1)
                p = torch.softmax(s.final[t + step].float() @ draft_lm_head.T, -1)
                losses[step].append(-(p * log_q).sum())
                agree[step].append(float(log_q.argmax() == p.argmax()))
    total = sum(STEP_WEIGHT ** (j - 1) * torch.stack(losses[j]).mean() for j in losses)
    report = {j: (float(torch.stack(losses[j]).mean().detach()), sum(agree[j]) / len(agree[j]), len(agree[j])) for j in losses}
    return total, report


def test_the_training_loss_and_its_gradient_are_those_of_drafting_every_trained_chain_on_its_own():
    """The batched training-time test (only chains from the last prompt token on, packed, their
    own entries attended as dot products) gives the loss, per-step agreement and counts, and the
    gradient, of drafting each trained chain alone with the KV cache: padding, prompts of other
    lengths and chains that end early change nothing."""
    from specdec_core.train.dataset import make_batch
    from specdec_core.train.ttt import ttt_loss

    target = tiny_llama(seed=1, vocab=300)
    embed = target.get_input_embeddings()
    generator = torch.Generator().manual_seed(4)
    steps = 3
    sequences = _random_sequences(generator, [(19, 6), (11, 1), (15, 11), (24, 3)], vocab=300, hidden=64)
    draft_lm_head = target.get_output_embeddings().weight.detach()[:50].float()
    head = Eagle3Head.random(target.config, draft_vocab_size=50, layer_ids=(1, 1, 0), seed=3).float().train()
    batched, report = ttt_loss(head, embed, draft_lm_head, make_batch(sequences, steps), steps)
    batched_grads = torch.autograd.grad(batched, list(head.parameters()))
    alone, expected = _loss_chain_by_chain(head, embed, draft_lm_head, sequences, steps)
    alone_grads = torch.autograd.grad(alone, list(head.parameters()))

    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-6)
    assert report.keys() == expected.keys()
    for step in expected:
        torch.testing.assert_close(report[step][0], expected[step][0], rtol=1e-5, atol=1e-6)
        assert report[step][1:] == (pytest.approx(expected[step][1]), expected[step][2])
    for got, want in zip(batched_grads, alone_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_the_trained_head_drafts_in_the_engine_and_the_output_stays_the_targets(data_work, tiny_train_config, smol_tokenizer):
    from specdec_core import EagleDrafter, SamplingParams, SpeculativeEngine
    from specdec_core.presets.loading import load_preset

    target = load_preset("tiny-train", str(tiny_train_config), load_draft=False).target
    prompt = smol_tokenizer("The trained head drafts here")["input_ids"]
    params = SamplingParams(max_new_tokens=16)
    plain = SpeculativeEngine(target, smol_tokenizer, drafter=None).generate(prompt, params)
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=EagleDrafter.from_pretrained(data_work), draft_length=3, adaptive=False)
    result = engine.generate(prompt, params)
    assert result.token_ids == plain.token_ids
    assert result.stats.drafted_tokens > 0


def test_a_held_out_reply_to_a_prompt_also_trained_on_is_not_measured(tmp_path, tiny_train_data, smol_tokenizer):
    # The prompt source repeats some topic x template pairs: a held-out greedy reply to a prompt the
    # head trained on is one it may know by heart, so the measurement leaves it out.
    import shutil

    from specdec_core.train.data import DataSettings, features_path, read_shard, shard_path
    from specdec_core.train.dataset import held_out_shards, load_sequences

    data = tmp_path / "data"
    shutil.copytree(tiny_train_data, data)
    settings = DataSettings(shards=QUICK["shards"], per_shard=QUICK["per_shard"], batch_size=QUICK["gen_batch"],
                            max_new_tokens=QUICK["max_new_tokens"])
    (held,) = held_out_shards(settings.shards)
    long_enough = lambda row: len(row["reply_ids"]) >= 3  # noqa: E731 (shorter ones hold no draft chain)
    trained = next(filter(long_enough, read_shard(shard_path(data, 0))))
    trained_prompts = {tuple(r["prompt_ids"]) for r in read_shard(shard_path(data, 0)) if long_enough(r)}
    rows = read_shard(shard_path(data, held))
    features = torch.load(features_path(data, held), weights_only=True)
    repeat = {**next(filter(long_enough, rows)), "prompt_ids": trained["prompt_ids"]}
    width = features[0]["aux"].shape[-1], features[0]["final"].shape[-1]
    n = len(repeat["prompt_ids"]) + len(repeat["reply_ids"]) - 1
    repeat_features = {"aux": torch.zeros(n, width[0], dtype=torch.float16), "final": torch.zeros(n, width[1], dtype=torch.float16)}
    shard_path(data, held).write_text("".join(json.dumps(r) + "\n" for r in [*rows, repeat]))
    torch.save([*features, repeat_features], features_path(data, held))

    _, heldout = load_sequences(data, settings, smol_tokenizer)
    prompts = [s.ids[: s.reply_start].tolist() for s in heldout]
    assert trained["prompt_ids"] not in prompts
    assert len(heldout) == sum(long_enough(r) and tuple(r["prompt_ids"]) not in trained_prompts for r in rows) > 0


def test_rewrite_heldout_has_the_target_write_again_and_measure_only_the_first_held_out_shards(tmp_path, tiny_train_config):
    # The 4-bit target writes a shard three times slower than its bf16 twin: a long run has it
    # rewrite only the held-out shards it is measured on; the other held-out shards stay out of training.
    from dataclasses import replace

    from specdec_core.train.base import HELDOUT_BY_TARGET, load_split
    from specdec_core.train.data import read_shard

    settings = TrainSettings("tiny-train", str(tmp_path / "head"), config=str(tiny_train_config), data_dtype="bfloat16",
                             **{**QUICK, "shards": 19, "per_shard": 2, "gen_batch": 2}, rewrite_heldout=1, data_only=True)
    assert settings.rewritten_heldout == [8] and replace(settings, rewrite_heldout=None).rewritten_heldout == [8, 18]
    train(settings)
    work = Path(settings.work_dir)
    assert sorted(path.name for path in (work / HELDOUT_BY_TARGET).glob("shard-*.jsonl")) == ["shard-00008.jsonl"]

    tokenizer = load_preset("tiny-train", str(tiny_train_config), load_draft=False).tokenizer
    train_set, heldout = load_split(settings, tokenizer)
    rewritten = read_shard(work / HELDOUT_BY_TARGET / "shard-00008.jsonl")
    measured = {tuple(s.ids[: s.reply_start].tolist()) for s in heldout}
    assert heldout and [s.ids.tolist() for s in heldout] == [  # the target's own replies, of shard 8 only
        r["prompt_ids"] + r["reply_ids"] for r in rewritten if tuple(r["prompt_ids"]) in measured]
    shard_18 = {tuple(r["prompt_ids"] + r["reply_ids"]) for r in read_shard(work / "data" / "shard-00018.jsonl")}
    assert not any(tuple(s.ids.tolist()) in shard_18 for s in train_set)  # still held out, though not measured


def test_rewrite_heldout_without_a_cheaper_writer_is_refused_in_one_line(tmp_path, tiny_train_config, capsys):
    assert main(["--preset", "tiny-train", "--config", str(tiny_train_config), "--out", str(tmp_path / "head"),
                 "--rewrite-heldout", "1"]) != 0
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --rewrite-heldout needs --data-dtype other than target (the target wrote every shard already)"]


FREED_MEMORY_PROBE = """
import sys, torch
from specdec_core.train.base import keep_freed_memory
def rss_mb():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) // 1024
if sys.argv[1] == 'keep':
    keep_freed_memory()
before = rss_mb()
x = torch.ones(64 << 18)  # 64 MB, written
del x
print(rss_mb() - before)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc and /proc: Linux only")
def test_a_trainers_process_keeps_a_large_freed_tensors_memory_for_the_next_step():
    """keep_freed_memory (the trainers' entry points call it): a freed 64 MB tensor stays in the
    heap, ready for the next step's, instead of going back to the kernel (and being faulted in
    and zeroed again on the next allocation), as it does by default."""
    kept = {mode: int(subprocess.run([sys.executable, "-c", FREED_MEMORY_PROBE, mode], capture_output=True, text=True,
                                     check=True, timeout=120).stdout) for mode in ("keep", "default")}
    assert kept["keep"] >= 60 and kept["default"] < 8, kept
