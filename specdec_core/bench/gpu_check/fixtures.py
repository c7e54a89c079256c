"""What the parts decode with: random-weight models of real shapes, prompts prompt lookup can
copy from, our engine and Hugging Face's generate() run greedily, every drafter of this build."""

from __future__ import annotations

import contextlib

import torch

from ...engine import SpeculativeEngine
from ...decoding.eager import CachedModel
from ...sampling import SamplingParams
from ..architectures import NumberTokenizer


def shallow_copy(target, layers: int):
    """A draft that agrees with a random target often: its embedding, first layers and head."""
    import copy

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    with torch.device(target.device):
        draft = type(target)(config).to(target.dtype)
    draft.load_state_dict(target.state_dict(), strict=False)  # the deeper layers are left out
    draft.generation_config.eos_token_id = None
    return draft.eval()


def random_prompts(vocab: int, count: int, length: int, seed: int = 5) -> list[list[int]]:
    """Random prompts that repeat a phrase, so prompt lookup has something to copy."""
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(count):
        phrase = torch.randint(0, vocab, (max(length // 4, 4),), generator=generator).tolist()
        noise = torch.randint(0, vocab, (length,), generator=generator).tolist()
        prompts.append((noise[: length // 2] + phrase + noise[length // 2 :] + phrase)[:length])
    return prompts


def make_engine(target, drafter=None, make_runner=CachedModel, k: int = 4) -> SpeculativeEngine:
    return SpeculativeEngine(target, NumberTokenizer(), drafter=drafter, draft_length=k, adaptive=False,
                             make_runner=make_runner)


def greedy(engine: SpeculativeEngine, prompt: list[int], tokens: int, tree_nodes: int = 0) -> tuple[list[int], object]:
    """A greedy reply and its stats; chains only unless `tree_nodes` (the most nodes a round verifies)."""
    engine.forget()
    result = engine.generate(prompt, SamplingParams(max_new_tokens=tokens), tree_nodes)
    return result.token_ids, result.stats


def hf_greedy(model, prompt: list[int], tokens: int) -> list[int]:
    from transformers import GenerationConfig

    ids = torch.tensor([prompt], device=model.device)
    config = GenerationConfig(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, num_beams=1,
                              eos_token_id=None, pad_token_id=0, use_cache=True)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, len(prompt):].tolist()


def every_drafter(target, draft, make_draft_runner=CachedModel) -> dict[str, object]:
    """Every drafter this build has, by name (EAGLE only when its drafter exists)."""
    from ...drafters import ModelDrafter, PromptLookupDrafter

    drafters = {"model": ModelDrafter(draft, make_runner=make_draft_runner), "prompt_lookup": PromptLookupDrafter()}
    eagle = eagle_drafter(target)
    if eagle is not None:
        drafters["eagle"] = eagle
    return drafters


def tree_drafters(target) -> dict[str, object]:
    """The drafters that propose trees, with random heads of the target's shape: the EAGLE head's
    dynamic trees and Medusa's candidate trees (each only where this build has it)."""
    from ... import drafters

    found = {}
    eagle = eagle_drafter(target)
    if eagle is not None:
        found["eagle"] = eagle
    if hasattr(drafters, "MedusaDrafter"):
        text = target.config.get_text_config()
        heads = drafters.MedusaHeads.random(3, 1, text.hidden_size)
        found["medusa"] = drafters.MedusaDrafter(heads.to(device=target.device, dtype=target.dtype), text.num_hidden_layers)
    return found


def eagle_drafter(target):
    """An EAGLE-3 drafter with a random head of the target's shape, if this build has one."""
    from ... import drafters

    make = getattr(drafters, "EagleDrafter", None)
    if make is None:
        return None
    head = drafters.Eagle3Head.random(target.config, dtype=target.dtype).to(target.device)
    return make(head)


@contextlib.contextmanager
def tf32_off():
    """fp32 matmuls in full precision (TF32 would make fp32 round like a lower precision)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"].get("cudagraph_skips", 0))


def eagle_drafter_missing() -> bool:
    from ... import drafters

    return not hasattr(drafters, "EagleDrafter")
