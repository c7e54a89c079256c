"""The EAGLE-3 head module: its checkpoint format, save/load, and the incremental computation."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from specdec_core.drafters.eagle_head import ARCHITECTURE, Eagle3Head, default_layer_ids
from specdec_core.errors import LoadError
from specdec_core.decoding.eager import growing_cache
from tests.tiny_models import FOLDER_DAMAGES, damaged_folder

SMOLLM2_SHAPE = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
)


def _tiny_target_config(**overrides) -> LlamaConfig:
    values = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    values.update(overrides)
    return LlamaConfig(**values)


def test_default_layers_are_vllms():
    assert default_layer_ids(30) == (2, 15, 27)
    assert default_layer_ids(32) == (2, 16, 29)
    assert all(0 <= i < 2 for i in default_layer_ids(2))


def test_smollm2_head_is_small_and_saved_in_the_eagle3_format(tmp_path):
    head = Eagle3Head.random(LlamaConfig(**SMOLLM2_SHAPE), draft_vocab_size=8192)
    assert 9e6 < head.parameter_count < 11e6
    head.save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE]
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size"):
        assert key in config, key
    assert config["draft_vocab_size"] == 8192 and config["vocab_size"] == 49152
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    tensors = load_file(str(tmp_path / "model.safetensors"))
    H, V, D = 576, 49152, 8192
    expected = {
        "fc.weight": (H, 3 * H),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (9 * 64, 2 * H),
        "midlayer.self_attn.k_proj.weight": (3 * 64, 2 * H),
        "midlayer.self_attn.v_proj.weight": (3 * 64, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, 9 * 64),
        "midlayer.post_attention_layernorm.weight": (H,),
        "midlayer.mlp.gate_proj.weight": (1536, H),
        "midlayer.mlp.up_proj.weight": (1536, H),
        "midlayer.mlp.down_proj.weight": (H, 1536),
        "norm.weight": (H,),
        "lm_head.weight": (D, H),
        "d2t": (D,),
        "t2d": (V,),
    }
    assert {name: tuple(t.shape) for name, t in tensors.items()} == expected
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert tensors["fc.weight"].dtype == torch.bfloat16


def test_round_trip_keeps_weights_and_the_vocabulary_map(tmp_path):
    head = Eagle3Head.random(_tiny_target_config(), draft_vocab_size=50, seed=3)
    chosen = list(range(250, 300)) [::-1]
    head.set_draft_vocab(chosen)
    head.save(tmp_path, dtype=None)
    loaded = Eagle3Head.load(tmp_path)
    assert loaded.layer_ids == head.layer_ids
    assert loaded.target_token_ids().tolist() == chosen
    assert int(loaded.t2d.sum()) == 50 and bool(loaded.t2d[chosen].all())
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_incremental_passes_equal_one_pass():
    head = Eagle3Head.random(_tiny_target_config(), draft_vocab_size=40, seed=1)
    torch.manual_seed(0)
    features, embeds = torch.randn(1, 7, 3 * 64), torch.randn(1, 7, 64)
    with torch.no_grad():
        full = head(embeds, head.project(features), growing_cache(head.config))
        cache = growing_cache(head.config)
        parts = [head(embeds[:, a:b], head.project(features[:, a:b]), cache) for a, b in ((0, 3), (3, 4), (4, 7))]
    assert cache.get_seq_length() == 7
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


def test_llama31_rope_scaling_is_written_and_read(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    target = _tiny_target_config(max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=scaling)
    Eagle3Head.random(target, draft_vocab_size=20).save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rope_theta"] == 500000.0 and config["rope_scaling"]["rope_type"] == "llama3"
    assert Eagle3Head.load(tmp_path).config.rope_parameters["rope_type"] == "llama3"


def test_vllm_names_and_a_full_vocabulary_head_load(tmp_path):
    """vLLM's `layers.0.` spelling, top-level layer ids, no d2t/t2d (draft vocab = vocab) and
    an embed_tokens copy all load."""
    head = Eagle3Head.random(_tiny_target_config(), draft_vocab_size=300)
    head.save(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    renamed = {n.replace("midlayer.", "layers.0."): t for n, t in tensors.items() if n not in ("d2t", "t2d")}
    renamed["embed_tokens.weight"] = torch.zeros(300, 64)
    save_file(renamed, str(tmp_path / "model.safetensors"))
    config = json.loads((tmp_path / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = config.pop("eagle_config")["eagle_aux_hidden_state_layer_ids"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = Eagle3Head.load(tmp_path)
    assert loaded.target_token_ids().tolist() == list(range(300))


EAGLE_DAMAGES = {"wrong_arch": lambda config: {**config, "architectures": ["LlamaForCausalLM"]},
                 "wrong_shape": lambda config: {**config, "hidden_size": 32}}


@pytest.mark.parametrize("damage", [*FOLDER_DAMAGES, *EAGLE_DAMAGES])
def test_broken_heads_fail_with_one_line(tmp_path, damage):
    Eagle3Head.random(_tiny_target_config(), draft_vocab_size=20).save(tmp_path / "head")
    folder = damaged_folder(tmp_path / "head", damage, "model.safetensors", EAGLE_DAMAGES)
    with pytest.raises(LoadError) as raised:
        Eagle3Head.load(folder)
    assert "\n" not in str(raised.value)


def test_the_rows_a_head_has_yet_to_read_queue_in_order():
    from specdec_core.drafters.eagle import _Rows

    rows = _Rows()
    for chunk in ([0, 1, 2], [3], [4, 5], []):  # the features of positions 0..5, as rounds add them
        rows.append(torch.tensor(chunk, dtype=torch.float32)[:, None])
    assert len(rows) == 6
    assert rows.pop(2)[:, 0].tolist() == [0, 1]
    rows.keep(3)  # a new sequence agrees up to position 4: rows 2, 3, 4 stay
    assert len(rows) == 3 and rows.pop(3)[:, 0].tolist() == [2, 3, 4]
    assert len(rows) == 0
