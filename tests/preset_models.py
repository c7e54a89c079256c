"""Tiny models in folders and a fake hub cache, named by a test models.yaml.

Everything loads through specdec_core.presets.loading exactly as real presets do: local folders by
path, and `tiny-org/tiny-llama` as a hub repo id found in a hub cache laid out the way
huggingface_hub writes it (used with HF_HUB_CACHE and HF_HUB_OFFLINE=1 in a subprocess).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from tests.tiny_models import VOCAB, tiny_llama, tiny_qwen2

HUB_REPO = "tiny-org/tiny-llama"
PADDING = 64  # extra embedding rows of the draft: families pad their vocabularies differently

PRESETS_YAML = """\
# Tiny presets for the loading and CLI tests.
auto_fallback: tiny
presets:
  tiny:
    description: tiny Llama target, draft with a padded vocabulary
    target: ./target
    draft: ./draft-padded
    drafter: model
    draft_length: 4
    memory_gb: 0.1
  tiny-4bit:
    description: the same pair with an nf4 draft
    target: ./target
    draft: ./draft-padded
    draft_quantization: 4bit
    drafter: model
    memory_gb: 0.1
  tiny-8bit:
    description: the same pair with an int8 draft
    target: ./target
    draft: ./draft-padded
    draft_quantization: 8bit
    drafter: model
    memory_gb: 0.1
  tiny-qwen:
    description: tiny Qwen2 target, no draft model
    target: ./qwen
    drafter: prompt_lookup
    memory_gb: 0.1
  tiny-mismatch:
    description: a draft with another tokenizer
    target: ./target
    draft: ./other-tokenizer
    drafter: model
    memory_gb: 0.1
  tiny-hub:
    description: the tiny target as a hub repo id (cached)
    target: tiny-org/tiny-llama
    drafter: prompt_lookup
    memory_gb: 0.1
  missing-hub:
    description: a hub repo that is not cached
    target: specdec-tests/not-cached
    drafter: none
    memory_gb: 0.1
  gated-hub:
    description: a gated hub repo
    target: specdec-tests/gated
    drafter: none
    memory_gb: 0.1
    gated: true
  tiny-eagle:
    description: the tiny target with a random EAGLE-3 head and a draft model
    target: ./target
    draft: ./draft-padded
    eagle: ./eagle
    drafter: eagle
    draft_length: 3
    memory_gb: 0.1
  tiny-eagle-misfit:
    description: an EAGLE-3 head made for a wider target
    target: ./target
    eagle: ./eagle-wide
    drafter: prompt_lookup
    memory_gb: 0.1
  tiny-eagle-broken:
    description: an EAGLE-3 head folder with damaged weights
    target: ./target
    eagle: ./eagle-broken
    drafter: prompt_lookup
    memory_gb: 0.1
  tiny-eagle-missing:
    description: an EAGLE-3 head folder that does not exist (not trained yet)
    target: ./target
    eagle: ./no-such-head
    drafter: prompt_lookup
    memory_gb: 0.1
  tiny-medusa:
    description: the tiny target with random Medusa heads read out through its lm_head
    target: ./target
    medusa: ./medusa
    drafter: medusa
    draft_length: 3
    memory_gb: 0.1
  tiny-medusa-published:
    description: Medusa heads in the layout of Medusa's published checkpoints (medusa_lm_head.pt)
    target: ./target
    medusa: ./medusa-published
    drafter: medusa
    memory_gb: 0.1
  tiny-medusa-misfit:
    description: Medusa heads made for a wider target
    target: ./target
    medusa: ./medusa-wide
    drafter: prompt_lookup
    memory_gb: 0.1
  remote-code:
    description: opts in to code shipped with the model
    target: ./target
    drafter: none
    memory_gb: 0.1
    trust_remote_code: true
"""


@dataclass(frozen=True)
class TinyPresets:
    config: Path  # the models.yaml
    hub_cache: Path  # a hub cache holding HUB_REPO


def write_tiny_presets(folder: Path, tokenizer) -> TinyPresets:
    target = tiny_llama(seed=0, init=0.2)
    _save(target, tokenizer, folder / "target")
    _save(_padded_copy(target, PADDING), tokenizer, folder / "draft-padded")
    _save(tiny_qwen2(seed=2, init=0.2), tokenizer, folder / "qwen")
    other = other_tokenizer()
    _save(tiny_llama(seed=3, vocab=len(other)), other, folder / "other-tokenizer")
    _write_eagle_heads(target, folder)
    _write_medusa_heads(target, folder)
    hub_cache = folder / "hub"
    _fake_hub_snapshot(folder / "target", hub_cache, HUB_REPO)
    config = folder / "models.yaml"
    config.write_text(PRESETS_YAML)
    return TinyPresets(config=config, hub_cache=hub_cache)


def _write_eagle_heads(target, folder: Path) -> None:
    """A random head for the target, one for a wider target, and one with damaged weights."""
    from transformers import LlamaConfig

    from specdec_core.drafters import Eagle3Head

    Eagle3Head.random(target.config, draft_vocab_size=2048, seed=1).save(folder / "eagle")
    wide = LlamaConfig(vocab_size=VOCAB, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2)
    Eagle3Head.random(wide, draft_vocab_size=512).save(folder / "eagle-wide")
    Eagle3Head.random(target.config, draft_vocab_size=512).save(folder / "eagle-broken")
    (folder / "eagle-broken" / "model.safetensors").write_bytes(b"not a safetensors file")


def _write_medusa_heads(target, folder: Path) -> None:
    """Random heads for the target in our layout and in the published one, and heads for a wider target."""
    from tests.tiny_models import random_medusa_heads, write_published_medusa

    ours = random_medusa_heads(target, num_heads=3, own_output=False, seed=4, std=0.2)
    ours.draft_token_ids = list(range(0, target.config.vocab_size, 2))  # as our trainer saves them
    ours.save(folder / "medusa")
    write_published_medusa(folder / "medusa-published", random_medusa_heads(target, num_heads=5, seed=5))
    from specdec_core.drafters import MedusaHeads

    MedusaHeads.random(2, 1, 96, None).save(folder / "medusa-wide")


def other_tokenizer():
    """A small byte-level BPE trained here: a tokenizer of another 'family'."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _save(model, tokenizer, folder: Path) -> None:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _padded_copy(model, extra_rows: int):
    """The same weights with `extra_rows` more (zero) embedding and output rows, as a draft of
    the same family with a padded vocabulary; the engine drops the rows the target lacks."""
    padded = tiny_llama(seed=0, init=0.2, vocab=VOCAB + extra_rows)
    state = {key: value.clone() for key, value in model.state_dict().items()}
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = torch.zeros(VOCAB + extra_rows, state[key].shape[1])
        rows[:VOCAB] = state[key]
        state[key] = rows
    padded.load_state_dict(state)
    return padded


def _fake_hub_snapshot(source: Path, hub_cache: Path, repo_id: str) -> None:
    """Lay out `source` as huggingface_hub's cache does: refs/main -> snapshots/<commit>/files."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = hub_cache / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(source, repo_dir / "snapshots" / commit)
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
