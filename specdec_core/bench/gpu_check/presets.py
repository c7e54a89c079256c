"""The loading part: random-weight presets saved to a local folder (a models.yaml, a word-level
tokenizer), loaded by the preset loader: bf16, the draft on cuda:0, device_map="auto", nf4."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import yaml

from ...sampling import SamplingParams
from ..architectures import random_model
from .fixtures import shallow_copy
from .part import Part, Scale


# The presets written for the loading and app parts: the same random-weight pair three ways.
PRESETS = {
    "check-bf16": ("random-weight target and draft, bf16, draft on the first GPU", "none", False),
    "check-nf4": ("the same pair with an nf4 draft through bitsandbytes", "4bit", False),
    "check-compiled": ("the same pair, compiled steps (the app part)", "none", True),
}


def models_yaml(dtype: str, gpu: bool) -> str:
    """A models.yaml of PRESETS over ./target and ./draft."""
    presets = {
        name: {"description": description, "target": "./target", "draft": "./draft", "dtype": dtype,
               "draft_quantization": quantization, "drafter": "model", "draft_length": 4, "memory_gb": 4,
               "requires_gpu": gpu, "compile": compile}
        for name, (description, quantization, compile) in PRESETS.items()
    }
    header = "# Random-weight presets written by python -m specdec_core.gpu_check (its loading and app parts).\n"
    return header + yaml.safe_dump({"auto_fallback": "check-bf16", "presets": presets}, sort_keys=False)


def write_presets(scale: Scale, folder: Path) -> Path:
    """Random-weight target and draft (save_pretrained) with a word-level tokenizer, and a
    models.yaml naming them; returns the models.yaml."""
    folder.mkdir(parents=True, exist_ok=True)
    cuda = scale.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    target = random_model(scale.loading_target, dtype, "cpu", seed=3)
    draft = shallow_copy(target, 1)
    tokenizer = word_tokenizer(target.config.vocab_size)
    for name, model in (("target", target), ("draft", draft)):
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
    config = folder / "models.yaml"
    config.write_text(models_yaml("bfloat16" if cuda else "float32", gpu=cuda))
    return config


def word_tokenizer(vocab: int):
    """A tokenizer with no download: `w0 w1 ...` words, ChatML special tokens and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    words = {token: i for i, token in enumerate(specials)}
    words.update({f"w{i}": i for i in range(len(specials), vocab)})
    core = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<|im_end|>",
                                        pad_token="<unk>", bos_token="<|im_start|>")
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    return tokenizer


def part_loading(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """The preset loader on random-weight presets in a local folder."""
    import tempfile

    from ...presets.loaded import unload
    from ...presets.loading import load_preset

    folder = Path(tempfile.mkdtemp(prefix="gpu_check_presets_"))
    config = write_presets(scale, folder)
    shared["presets"] = config
    cuda = scale.device.startswith("cuda")
    models = load_preset("check-bf16", str(config), compile=False)
    try:
        target_map = getattr(models.target, "hf_device_map", None)
        part.data["check-bf16"] = {"describe": models.describe(), "notes": models.notes, "target_device_map": str(target_map)}
        want = torch.bfloat16 if cuda else torch.float32
        part.check(f"weights load as {str(want).removeprefix('torch.')}",
                   models.target.dtype == want and models.draft.dtype == want,
                   f"target {models.target.dtype}, draft {models.draft.dtype}")
        part.check("draft on cuda:0", str(models.draft.device) == "cuda:0" if cuda else None, str(models.draft.device))
        part.check('target placed by device_map="auto"', bool(target_map) if cuda else None, str(target_map))
        plain = models.make_engine(drafter="none").generate([5, 6, 7, 8], SamplingParams(max_new_tokens=12))
        spec = models.make_engine(drafter="model", adaptive=False).generate([5, 6, 7, 8], SamplingParams(max_new_tokens=12))
        part.check("the loaded pair decodes", plain.stats.new_tokens > 0 and spec.stats.new_tokens > 0,
                   f"identical to plain decoding: {spec.token_ids == plain.token_ids} (bf16 may differ at a tie)")
    finally:
        unload(models)
    if importlib.util.find_spec("bitsandbytes") is None:
        part.check("nf4 draft through bitsandbytes", None, "bitsandbytes is not installed here")
    else:
        quantized = load_preset("check-nf4", str(config), compile=False)
        try:
            info = [i for i in quantized.info if i.role == "draft"][0]
            part.check("nf4 draft through bitsandbytes", "nf4" in str(info.quantization).lower() or "4" in str(info.quantization),
                       f"{info.line()}; notes: {'; '.join(quantized.notes) or 'none'}")
            reply = quantized.make_engine(drafter="model").generate([5, 6, 7, 8], SamplingParams(max_new_tokens=8))
            part.check("the nf4 pair decodes", reply.stats.new_tokens > 0, f"{reply.stats.new_tokens} tokens")
        finally:
            unload(quantized)
    return None
