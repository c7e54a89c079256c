"""Medusa heads: K small heads on the target's last hidden state, each guessing one token further.

Architecture (Cai et al., Medusa, arXiv 2401.10774; the checkpoint layout is the one the
FasterDecoding/Medusa code writes):

    h         = the target's last hidden state at position t (after its final norm) [n, H]
    head i    : x = h; x = x + SiLU(linear_ij(x)) for each of its L residual blocks;
                logits_i = out_i(x)                       [n, V]
    head i at position t guesses the token at t + 2 + i: the target's own lm_head at t gives
    t + 1 (the token a verify adds anyway), head 0 the one after it.

Checkpoint folder: config.json with medusa_num_heads and medusa_num_layers (and
base_model_name_or_path), and medusa_lm_head.safetensors (or Medusa's older medusa_lm_head.pt)
holding the state dict of a list of per-head Sequentials: "{i}.{j}.linear.weight" [H, H] and
"{i}.{j}.linear.bias" [H] for block j < L, "{i}.{L}.weight" [V, H] for the head's output layer.
A file without the output layers (Medusa's first, legacy layout) has the heads read out through
the target's own lm_head; this project's trained heads are saved that way (their output layer
would be a copy of the lm_head: 28M parameters a head for SmolLM2).

Beside Medusa's files, this project's heads keep the tokens they were trained to guess among
(draft_vocab.json: {"token_ids": [...]}, the training replies' most frequent tokens). The drafter
then reads out only those rows of the lm_head: on the 4-bit SmolLM2 (two cores) the three heads'
logits cost 3.3-3.8 ms a round through the whole lm_head (49,152 rows), about a third of a
compiled target step, and 1.0 ms over 8,192 of its rows. They also guess better there (held out,
head 1's top-1 0.305 -> 0.327): a token they were never trained against can't take the argmax.
Medusa's own code ignores the file; heads without it read out the whole vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ..errors import LoadError

WEIGHTS_FILE = "medusa_lm_head.safetensors"
LEGACY_WEIGHTS_FILE = "medusa_lm_head.pt"
DRAFT_VOCAB_FILE = "draft_vocab.json"


class ResBlock(nn.Module):
    """x + SiLU(linear(x)): starts as the identity when linear's weight is zero."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    """K heads of L residual blocks each, with their own output layers or (None) the target's."""

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int, vocab_size: int | None,
                 base_model: str = "", draft_token_ids: list[int] | None = None) -> None:
        super().__init__()
        if num_heads < 1 or num_layers < 0:
            raise ValueError(f"Medusa heads need at least 1 head and 0 or more layers, got {num_heads} and {num_layers}")
        self.num_heads, self.num_layers = num_heads, num_layers
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.base_model = base_model
        # The target tokens the heads guess among (sorted; None: the whole vocabulary).
        self.draft_token_ids = sorted(set(int(t) for t in draft_token_ids)) if draft_token_ids is not None else None
        own_output = vocab_size is not None
        # Indexed as Medusa's Sequentials are, so state_dict() keys are the file's.
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)],
                          *([nn.Linear(hidden_size, vocab_size, bias=False)] if own_output else []))
            for _ in range(num_heads)
        )

    @property
    def own_output(self) -> bool:
        """Whether each head has its own output layer (else the target's lm_head reads it out)."""
        return self.vocab_size is not None

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def hidden(self, final: torch.Tensor, count: int | None = None) -> torch.Tensor:
        """[n, H] final hidden states -> [K, n, H] each head's state before its output layer (the
        first `count` heads' only, when given)."""
        return torch.stack([head[: self.num_layers](final) for head in self.heads[:count]])

    def logits(self, final: torch.Tensor, lm_head: nn.Module | None = None, count: int | None = None) -> torch.Tensor:
        """[n, H] final hidden states -> [K, n, V] logits (the first `count` heads'); `lm_head`
        (the target's) reads out heads without an output layer of their own."""
        states = self.hidden(final, count)
        if self.own_output:
            return torch.stack([head[-1](state) for head, state in zip(self.heads, states)])
        if lm_head is None:
            raise ValueError("these Medusa heads read out through the target's lm_head: pass it")
        return lm_head(states)

    @classmethod
    def random(cls, num_heads: int, num_layers: int, hidden_size: int, vocab_size: int | None = None,
               seed: int = 0, std: float = 0.02, base_model: str = "") -> MedusaHeads:
        """Heads with seeded random block weights (std `std`; 0: Medusa's start, the identity)."""
        generator = torch.Generator().manual_seed(seed)
        heads = cls(num_heads, num_layers, hidden_size, vocab_size, base_model)
        with torch.no_grad():
            for parameter in heads.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
        return heads.eval()

    def save(self, folder: str | Path, dtype: torch.dtype | None = torch.float16) -> Path:
        """Write config.json and medusa_lm_head.safetensors (weights cast to `dtype`)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {name: (t.to(dtype) if dtype is not None else t).detach().cpu().contiguous()
                   for name, t in self.heads.state_dict().items()}
        save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        config = {"medusa_num_heads": self.num_heads, "medusa_num_layers": self.num_layers,
                  "base_model_name_or_path": self.base_model, "hidden_size": self.hidden_size,
                  "torch_dtype": str(dtype or self.dtype).removeprefix("torch.")}
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if self.draft_token_ids is not None:
            (folder / DRAFT_VOCAB_FILE).write_text(json.dumps({"token_ids": self.draft_token_ids}) + "\n")
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> MedusaHeads:
        """Read a head folder in Medusa's format. LoadError (one line) for a missing or broken one."""
        folder = Path(folder)
        config_path = folder / "config.json"
        if not folder.is_dir():
            raise LoadError(f"Medusa heads folder {folder} doesn't exist: train them (python -m specdec_core.train_medusa) or fix the medusa: source")
        if not config_path.is_file():
            raise LoadError(f"Medusa heads folder {folder} has no config.json: point medusa: at a folder in Medusa's format")
        try:
            raw = json.loads(config_path.read_text())
        except (OSError, ValueError) as error:
            raise LoadError(f"Medusa heads config {config_path} is not valid JSON ({error}): re-download or re-train the heads") from None
        if "medusa_num_heads" not in raw:
            raise LoadError(f"{config_path} is not a Medusa heads config (no medusa_num_heads): point medusa: at Medusa heads")
        num_heads, num_layers = int(raw["medusa_num_heads"]), int(raw.get("medusa_num_layers", 1))
        state = _read_weights(folder)
        # A file may hold more heads than the config uses: Medusa then loads the first K too.
        state = {k: v for k, v in state.items() if not (k.split(".")[0].isdigit() and int(k.split(".")[0]) >= num_heads)}
        first = state.get(f"0.{num_layers}.weight")
        block = state.get("0.0.linear.weight")
        width = block.shape[1] if block is not None else first.shape[1] if first is not None else None
        if width is None:
            raise LoadError(f"Medusa heads {folder} hold no weights for head 0: re-download or re-train the heads")
        vocab = first.shape[0] if first is not None else None
        try:
            heads = cls(num_heads, num_layers, width, vocab, str(raw.get("base_model_name_or_path") or ""),
                        _read_draft_vocab(folder))
            dtype = next((t.dtype for t in state.values() if t.is_floating_point()), torch.float32)
            heads.to(dtype).heads.load_state_dict(state, strict=True)
        except (RuntimeError, ValueError, IndexError) as error:
            line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise LoadError(f"Medusa heads {folder} don't match their config.json ({line}): re-download or re-train the heads") from None
        return heads.eval()


def _read_draft_vocab(folder: Path) -> list[int] | None:
    path = folder / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    try:
        ids = json.loads(path.read_text())["token_ids"]
        if not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise ValueError("not a list of token ids")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise LoadError(f"{path} is not a draft vocabulary ({error}): delete it (the heads then read out every "
                        "token) or re-train the heads") from None
    return ids


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    try:
        if (folder / WEIGHTS_FILE).is_file():
            from safetensors.torch import load_file

            state = load_file(str(folder / WEIGHTS_FILE))
        elif (folder / LEGACY_WEIGHTS_FILE).is_file():
            # weights_only: tensors only; unpickling anything else could run code the file names.
            state = torch.load(folder / LEGACY_WEIGHTS_FILE, map_location="cpu", weights_only=True)
        else:
            state = None
    except Exception as error:  # safetensors and torch raise several types for a damaged file
        raise LoadError(f"Medusa heads weights in {folder} can't be read ({type(error).__name__}): re-download or re-train the heads") from None
    if state is None:
        raise LoadError(f"Medusa heads folder {folder} has no {WEIGHTS_FILE}: re-download or re-train the heads")
    return {name.removeprefix("medusa_head."): tensor for name, tensor in state.items()}  # saved from a whole model
