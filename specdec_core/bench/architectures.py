"""Random-weight models of real architectures: their sizes are data (data/architectures.yaml),
and a step's cost depends on the shapes only, so the cost model, the ceiling and the GPU check
measure a 7B model without downloading one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import yaml

ARCHITECTURES_FILE = Path(__file__).resolve().parent / "data" / "architectures.yaml"
ARCHITECTURES: dict[str, dict] = yaml.safe_load(ARCHITECTURES_FILE.read_text())


class NumberTokenizer:
    """Enough of a tokenizer for random-weight models: ids decode to numbers, nothing ends a reply."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f" {int(i)}" for i in ids)


def load_architecture(name_or_path: str) -> dict:
    """A name of ARCHITECTURES, or a config.json path; returns the config dict."""
    if name_or_path in ARCHITECTURES:
        return dict(ARCHITECTURES[name_or_path])
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise ValueError(
            f"unknown architecture '{name_or_path}': use one of {', '.join(ARCHITECTURES)} or a config.json path"
        )
    config = json.loads(path.read_text())
    if "model_type" not in config:
        raise ValueError(f"{path} has no model_type: give a Hugging Face config.json")
    return config


def build_model(config: dict, dtype: torch.dtype, device: torch.device):
    """A random-weight causal LM of this architecture, built directly on the device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "torch_dtype", "dtype")}
    hf_config = AutoConfig.for_model(config["model_type"], **fields)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    return model.eval()


def random_model(name_or_path: str, dtype: torch.dtype, device: torch.device | str, seed: int = 0):
    """build_model of a named architecture (or a config.json), seeded, generating to the full
    length asked for: random weights would end a reply at a random EOS."""
    torch.manual_seed(seed)
    model = build_model(load_architecture(name_or_path), dtype, torch.device(device))
    model.generation_config.eos_token_id = None
    return model


def random_tokens(vocab: int, count: int, seed: int = 1234) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (count,), generator=generator).tolist()


def check_memory(configs, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse, in one line, models whose weights would not fit (a 7B model in fp32 on a laptop)."""
    need = sum(parameter_estimate(c) for c in configs) * torch.tensor([], dtype=dtype).element_size()
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return
    if need > 0.8 * free:
        raise ValueError(
            f"the two models need about {need / 1e9:.1f} GB and {free / 1e9:.1f} GB is free on {device}: "
            "pick smaller --target-config / --draft-config"
        )


def parameter_estimate(config: dict) -> int:
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or h // heads
    attention = h * heads * head_dim * 2 + h * kv * head_dim * 2
    embeddings = config["vocab_size"] * h * (1 if config.get("tie_word_embeddings", True) else 2)
    return layers * (attention + 3 * h * i) + embeddings
