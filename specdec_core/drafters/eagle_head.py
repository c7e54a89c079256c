"""The EAGLE-3 draft head: one decoder layer that reads the target's own features.

Architecture (Li et al., EAGLE-3, arXiv 2503.01840; the checkpoint layout is the one SafeAILab's
EAGLE code writes and vLLM and SGLang load as `LlamaForCausalLMEagle3`):

    features  = the target's residual stream entering three of its layers (vLLM's default:
                layers 2, L//2 and L-3), concatenated: [n, 3 * H_target]
    hidden    = fc(features)                                    at the first draft step
              | the head's own previous output (before `norm`)  at later draft steps
    x         = concat(input_layernorm(embed(token)), hidden_norm(hidden))          [n, 2H]
    h         = hidden + o_proj(attention(q/k/v_proj(x)))       (the residual is `hidden`)
    out       = h + mlp(post_attention_layernorm(h))            -> fed back at the next step
    logits    = lm_head(norm(out))                              over the draft vocabulary
    target id = draft id + d2t[draft id]

At sequence position j the head reads the target's features at position j and the embedding of
token j+1, and predicts token j+2. The token embedding is the target's (the checkpoint has no
embed_tokens), so the head is small: about 9M parameters for SmolLM2-135M with an 8k vocabulary.

Checkpoint folder: config.json (architectures ["LlamaForCausalLMEagle3"], the Llama keys,
draft_vocab_size, target_hidden_size, eagle_config.eagle_aux_hidden_state_layer_ids) and
model.safetensors with fc.weight, midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}
.weight, midlayer.self_attn.{q,k,v,o}_proj.weight, midlayer.mlp.{gate,up,down}_proj.weight,
norm.weight, lm_head.weight, d2t (int64), t2d (bool). Loading also reads pytorch_model.bin and
vLLM's `layers.0.` spelling of `midlayer.`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

from ..errors import LoadError

ARCHITECTURE = "LlamaForCausalLMEagle3"
_ARCHITECTURES = {ARCHITECTURE, "Eagle3LlamaForCausalLM"}  # vLLM accepts both spellings
WEIGHTS_FILE = "model.safetensors"
DEFAULT_DRAFT_VOCAB = 32000


def default_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose inputs feed the head, as vLLM picks them: 2, L//2, L-3 (clamped
    for very shallow targets so the three stay inside the model)."""
    return tuple(min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))


class Eagle3DecoderLayer(nn.Module):
    """The head's one decoder layer ("midlayer"): attention over [embedding, hidden] (2H wide)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        width = config.hidden_size
        self.input_layernorm = LlamaRMSNorm(width, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(width, eps=config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx=0)
        # transformers' attention, fed the 2H-wide concatenation instead of H.
        attn = self.self_attn
        kv_width = config.num_key_value_heads * attn.head_dim
        attn.q_proj = nn.Linear(2 * width, config.num_attention_heads * attn.head_dim, bias=False)
        attn.k_proj = nn.Linear(2 * width, kv_width, bias=False)
        attn.v_proj = nn.Linear(2 * width, kv_width, bias=False)
        self.post_attention_layernorm = LlamaRMSNorm(width, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        # Some published heads normalise the residual too (vLLM's norm_before_residual).
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache=None,
    ) -> torch.Tensor:
        """embeds, hidden: [1, n, H] -> [1, n, H] (the layer's output, before the final norm)."""
        x, residual = self.attention_input(embeds, hidden)
        attended, _ = self.self_attn(
            hidden_states=x, position_embeddings=position_embeddings, attention_mask=attention_mask, cache=cache
        )
        return self.finish(residual, attended)

    # The pieces of forward, for a caller that runs the attention itself (the trainer's
    # training-time test: its chains see different keys, see train/ttt.py).

    def attention_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x [..., n, 2H] the attention reads, the residual [..., n, H])."""
        normed_hidden = self.hidden_norm(hidden)
        residual = normed_hidden if self.norm_before_residual else hidden
        return torch.cat([self.input_layernorm(embeds), normed_hidden], dim=-1), residual

    def queries(self, x: torch.Tensor, position_embeddings) -> torch.Tensor:
        """[B, n, 2H] -> rotated queries [B, heads, n, head_dim]."""
        return _rotated(self.self_attn.q_proj(x), self.self_attn.head_dim, position_embeddings)

    def keys_values(self, x: torch.Tensor, position_embeddings) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, n, 2H] -> (rotated keys, values), each [B, kv_heads, n, head_dim]."""
        attn = self.self_attn
        values = attn.v_proj(x).unflatten(-1, (-1, attn.head_dim)).transpose(1, 2)
        return _rotated(attn.k_proj(x), attn.head_dim, position_embeddings), values

    def finish(self, residual: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The layer's output from the attention's (after o_proj) [..., n, H]."""
        h = residual + attended
        return h + self.mlp(self.post_attention_layernorm(h))


def _rotated(projected: torch.Tensor, head_dim: int, position_embeddings) -> torch.Tensor:
    """[B, n, heads * head_dim] -> [B, heads, n, head_dim] with RoPE applied, as LlamaAttention does."""
    states = projected.unflatten(-1, (-1, head_dim)).transpose(1, 2)
    cos, sin = (t.unsqueeze(1) for t in position_embeddings)
    return states * cos + rotate_half(states) * sin


class Eagle3Head(nn.Module):
    """An EAGLE-3 head for one target. `layer_ids`: the target layers whose inputs it reads."""

    def __init__(self, config: LlamaConfig, layer_ids: tuple[int, ...], target_hidden_size: int | None = None) -> None:
        super().__init__()
        config._attn_implementation = "sdpa"  # takes the boolean mask built in causal_mask
        self.config = config
        self.layer_ids = tuple(int(i) for i in layer_ids)
        self.target_hidden_size = target_hidden_size or config.hidden_size
        self.draft_vocab_size = int(config.draft_vocab_size)
        self.fc = nn.Linear(len(self.layer_ids) * self.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, self.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.set_draft_vocab(list(range(self.draft_vocab_size)))

    # ---- the computation -------------------------------------------------------------------

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """[..., 3 * H_target] target features -> [..., H] hidden for the first draft step."""
        return self.fc(features.to(self.dtype))

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        cache=None,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One pass of the decoder layer.

        embeds: [1, n, H] target embeddings of tokens j+1; hidden: [1, n, H] (project(features at
        j), or the head's own output of the previous step). Positions default to those after the
        cache's length; the mask defaults to causal over the cache. Returns [1, n, H] (pre-norm).
        """
        n = embeds.shape[1]
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + n, device=embeds.device)[None]
        if attention_mask is None:
            attention_mask = causal_mask(n, past, embeds.device)
        embeds, hidden = embeds.to(self.dtype), hidden.to(self.dtype)
        position_embeddings = self.rotary_emb(hidden, position_ids)
        return self.midlayer(embeds, hidden, position_embeddings, attention_mask, cache)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """[..., H] layer outputs -> [..., draft_vocab] logits."""
        return self.lm_head(self.norm(out))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target-vocabulary ids (draft id + d2t[draft id])."""
        return draft_ids + self.d2t[draft_ids]

    def target_token_ids(self) -> torch.Tensor:
        """[draft_vocab] the target id of every draft id."""
        return self.to_target_ids(torch.arange(self.draft_vocab_size, device=self.d2t.device))

    def set_draft_vocab(self, target_ids: list[int]) -> None:
        """Make draft id i stand for target token target_ids[i] (e.g. the most frequent tokens of
        the target's replies, which is how EAGLE-3 picks its draft vocabulary)."""
        ids = torch.as_tensor(target_ids, dtype=torch.long)
        if ids.shape != (self.draft_vocab_size,) or len(set(ids.tolist())) != len(ids):
            raise ValueError(f"need {self.draft_vocab_size} distinct target ids, got {len(ids)}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise ValueError(f"target ids must be in [0, {self.config.vocab_size})")
        self.d2t.copy_(ids - torch.arange(len(ids)))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype  # a norm: never swapped for a prepacked linear layer

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---- making, saving, loading -------------------------------------------------------------

    @classmethod
    def random(
        cls,
        target_config,
        draft_vocab_size: int | None = None,
        layer_ids: tuple[int, ...] | None = None,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        **overrides,
    ) -> Eagle3Head:
        """A randomly initialised head shaped for `target_config` (a transformers config of the
        target): the target's width, heads, MLP size, RoPE and vocabulary, one layer, draft
        vocabulary min(vocab, 32000) by default (its first ids). `overrides` set head config keys
        (e.g. intermediate_size) for a cheaper head."""
        text = target_config.get_text_config()
        vocab = int(text.vocab_size)
        config = head_config(text, draft_vocab_size or min(vocab, DEFAULT_DRAFT_VOCAB), **overrides)
        ids = layer_ids or default_layer_ids(text.num_hidden_layers)
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            head = cls(config, ids, target_hidden_size=text.hidden_size)
            for module in head.modules():  # Llama's initialisation: normal(0, initializer_range)
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, std=config.initializer_range)
        finally:
            torch.random.set_rng_state(generator_state)  # don't disturb the caller's RNG
        return head.to(dtype).eval()

    def save(self, folder: str | Path, dtype: torch.dtype | None = torch.bfloat16) -> Path:
        """Write config.json and model.safetensors in the EAGLE-3 format (weights cast to
        `dtype`, bf16 by default to keep files small; None keeps the head's dtype)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for name, tensor in self.state_dict().items():
            if name.startswith("rotary_emb."):
                continue
            if tensor.is_floating_point() and dtype is not None:
                tensor = tensor.to(dtype)
            tensors[name] = tensor.detach().cpu().contiguous()
        save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        saved_dtype = dtype or self.dtype
        (folder / "config.json").write_text(json.dumps(self.config_dict(saved_dtype), indent=2) + "\n")
        return folder

    def config_dict(self, dtype: torch.dtype) -> dict:
        """config.json's content: the Llama keys vLLM and SGLang read, plus the EAGLE-3 ones."""
        c = self.config
        rope = dict(getattr(c, "rope_parameters", None) or {})
        theta = rope.pop("rope_theta", getattr(c, "rope_theta", 10000.0))
        scaling = rope if rope.get("rope_type", "default") != "default" else None
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads,
            "head_dim": self.midlayer.self_attn.head_dim,
            "hidden_act": c.hidden_act,
            "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": theta,
            "rope_scaling": scaling,
            "max_position_embeddings": c.max_position_embeddings,
            "initializer_range": c.initializer_range,
            "vocab_size": c.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "tie_word_embeddings": False,
            "bos_token_id": c.bos_token_id,
            "eos_token_id": c.eos_token_id,
            "pad_token_id": c.pad_token_id,
            "torch_dtype": str(dtype).removeprefix("torch."),
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.layer_ids)},
        }

    @classmethod
    def load(cls, folder: str | Path, num_target_layers: int | None = None) -> Eagle3Head:
        """Read a head folder. `num_target_layers` gives the default feature layers when the
        config doesn't name them. Raises LoadError (one line) for a missing or broken folder."""
        folder = Path(folder)
        config_path = folder / "config.json"
        if not folder.is_dir():
            raise LoadError(f"EAGLE head folder {folder} doesn't exist: train one (python -m specdec_core.train_eagle) or fix the eagle: source")
        if not config_path.is_file():
            raise LoadError(f"EAGLE head folder {folder} has no config.json: point eagle: at a folder saved in the EAGLE-3 format")
        try:
            raw = json.loads(config_path.read_text())
        except (OSError, ValueError) as error:
            raise LoadError(f"EAGLE head config {config_path} is not valid JSON ({error}): re-download or re-train the head") from None
        if not _ARCHITECTURES & set(raw.get("architectures") or []):
            raise LoadError(
                f"{config_path} is not an EAGLE-3 head (architectures {raw.get('architectures')}, "
                f"need {ARCHITECTURE}): point eagle: at an EAGLE-3 head"
            )
        missing = [k for k in ("hidden_size", "num_attention_heads", "vocab_size") if k not in raw]
        if missing:
            raise LoadError(f"EAGLE head config {config_path} lacks {', '.join(missing)}: re-download or re-train the head")
        layer_ids = _layer_ids(raw, num_target_layers)
        if layer_ids is None:
            raise LoadError(f"EAGLE head config {config_path} names no target layers (eagle_aux_hidden_state_layer_ids)")
        state = _read_weights(folder)
        config = LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "eagle_config", "torch_dtype")})
        config.draft_vocab_size = int(raw.get("draft_vocab_size") or raw["vocab_size"])
        fc = state.get("fc.weight")
        target_hidden = raw.get("target_hidden_size") or (fc.shape[1] // len(layer_ids) if fc is not None else None)
        try:
            head = cls(config, layer_ids, target_hidden_size=target_hidden)
            if "d2t" not in state:  # a full-vocabulary head ships no mapping
                state["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
            if "t2d" not in state:
                state["t2d"] = torch.zeros(config.vocab_size, dtype=torch.bool)
                state["t2d"][torch.arange(config.draft_vocab_size) + state["d2t"]] = True
            dtype = next((t.dtype for t in state.values() if t.is_floating_point()), torch.float32)
            head.to(dtype).load_state_dict(state, strict=True)
        except (RuntimeError, ValueError, IndexError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise LoadError(f"EAGLE head {folder} doesn't match its config.json ({first}): re-download or re-train the head") from None
        return head.eval()


def head_config(target_text_config, draft_vocab_size: int, **overrides) -> LlamaConfig:
    """A one-layer Llama config for a head over this target (same width, heads, RoPE, vocabulary)."""
    t = target_text_config
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    values = dict(
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=getattr(t, "num_key_value_heads", None) or t.num_attention_heads,
        head_dim=head_dim,
        hidden_act=getattr(t, "hidden_act", "silu"),
        rms_norm_eps=getattr(t, "rms_norm_eps", 1e-6),
        max_position_embeddings=t.max_position_embeddings,
        rope_parameters=dict(getattr(t, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}),
        vocab_size=t.vocab_size,
        initializer_range=getattr(t, "initializer_range", 0.02),
        bos_token_id=t.bos_token_id,
        eos_token_id=t.eos_token_id,
        pad_token_id=getattr(t, "pad_token_id", None),
    )
    values.update(overrides)
    config = LlamaConfig(**values)
    config.draft_vocab_size = int(draft_vocab_size)
    return config


def causal_mask(n: int, past: int, device) -> torch.Tensor | None:
    """[1, 1, n, past + n] boolean mask (True: may attend) for n new tokens after `past` cached
    ones; None for a single token (it sees everything)."""
    if n == 1:
        return None
    rows = torch.arange(past, past + n, device=device)[:, None]
    return (torch.arange(past + n, device=device)[None, :] <= rows)[None, None]


def _layer_ids(raw: dict, num_target_layers: int | None) -> tuple[int, ...] | None:
    """Where vLLM looks: top-level eagle_aux_hidden_state_layer_ids, then eagle_config's; else
    its default for the target's depth."""
    ids = raw.get("eagle_aux_hidden_state_layer_ids") or (raw.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    )
    if ids:
        return tuple(int(i) for i in ids)
    return default_layer_ids(num_target_layers) if num_target_layers else None


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The head's tensors, names normalised to ours (vLLM's `layers.0.` is `midlayer.`; a
    `model.` prefix is dropped; an embed_tokens copy is ignored: the target's is used)."""
    files = sorted(folder.glob("*.safetensors"))
    try:
        if files:
            from safetensors.torch import load_file

            state = {}
            for file in files:
                state.update(load_file(str(file)))
        elif (folder / "pytorch_model.bin").is_file():
            state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        else:
            raise LoadError(f"EAGLE head folder {folder} has no weights (model.safetensors): re-download or re-train the head")
    except LoadError:
        raise
    except Exception as error:  # safetensors and torch raise several types for a damaged file
        raise LoadError(f"EAGLE head weights in {folder} can't be read ({type(error).__name__}): re-download or re-train the head") from None
    normalised = {}
    for name, tensor in state.items():
        name = name.removeprefix("model.")
        if name.startswith("layers.0."):
            name = "midlayer." + name.removeprefix("layers.0.")
        if "embed_tokens" in name:
            continue
        normalised[name] = tensor
    return normalised
