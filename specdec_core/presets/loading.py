"""Load a preset's target and draft models for this machine, or explain in one line why not.

Placement: on CUDA the draft goes on the first GPU and is loaded first, then the target with
device_map="auto", so accelerate shards it over all visible GPUs around what is already used.
On CPU everything is on "cpu". Weights are bf16 on CUDA and fp32 on CPU unless the preset
says otherwise; the draft can be quantized with bitsandbytes (nf4 or int8).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import torch

from ..kernels.int4_linear import gguf_weight_summary
from ..kernels.lean_layers import use_lean_layers
from ..kernels.row_attention import use_row_exact_attention
from .auto import choose_auto_preset
from .compile_recipe import CompileRecipe, helper_command
from .config import AUTO, ModelSpec, Preset, load_config
from .heads import load_heads
from .load_errors import load_errors
from .loaded import LoadedModels, ModelInfo
from .quiet import quietly
from .runners import decode_runners
from .sources import LoadError, ResolvedSource, gguf_file, resolve

__all__ = ["load_plain_target", "load_preset"]


@quietly  # one line per model (describe), not the libraries' bars and warnings
def load_preset(
    name: str = AUTO,
    config_path=None,
    *,
    load_draft: bool | None = True,
    compile: bool | str | None = None,
    load_eagle: bool | None = True,
    load_medusa: bool | None = True,
    cpu_weights: str | None = None,
    compile_in_background: bool = True,
) -> LoadedModels:
    """Load a preset by name ("auto" picks one for this machine; see models.yaml).

    load_draft=False skips the draft model (faster, for runs that won't use drafter "model");
    None loads it only when the preset's default drafter is "model". load_eagle likewise for the
    preset's EAGLE head (None: only when the default drafter is "eagle" or "hybrid"); a head that
    can't be loaded or doesn't fit the target leaves a note (and drafter "eagle" says why).
    load_medusa likewise for its Medusa heads (None: only when the default drafter is "medusa").
    compile: true | false | "auto" overrides the preset's `compile` key (None: the preset's);
    when on, both models' decoding steps are compiled here, before this returns. "auto" on CPU
    compiles a 4-bit target's steps in the background instead (LoadedModels.wait_for_compiling);
    compile_in_background=False leaves them eager (for a single reply, which would end first).
    cpu_weights: "fp32" | "gguf" overrides the preset's `cpu_weights` key (None: the preset's);
    "gguf" runs a CPU target's linear layers on its GGUF file's own 4-bit blocks (int4_linear).
    Raises ConfigError for an invalid file and LoadError (one line) for everything that
    stops the models from loading.
    """
    config = load_config(config_path)
    notes: list[str] = []
    if name == AUTO:
        name, notes = choose_auto_preset(config)
    preset = config.find(name)
    cuda = torch.cuda.is_available()
    notes += _preset_notes(preset, cuda)

    # Tokenizers first: a mismatched pair fails before any weights load.
    target_source, tokenizer = _source_and_tokenizer(preset.target, preset)
    if load_draft is None:
        load_draft = preset.drafter == "model"
    draft_spec = preset.draft if load_draft else None
    draft_source = draft_tokenizer = None
    if draft_spec is not None:
        draft_source, draft_tokenizer = _source_and_tokenizer(draft_spec, preset)
        check_same_tokenizer(tokenizer, draft_tokenizer, preset.target.label, draft_spec.label)

    dtype = resolve_dtype(preset.dtype, cuda)
    draft, info = None, []
    if draft_spec is not None:  # first, so the target's device_map="auto" sees it on GPU 0
        quantization, note = draft_quantization(preset.draft_quantization, cuda)
        notes += [note] if note else []
        draft, draft_info = _load_model(preset, "draft", draft_source, dtype, quantization, cuda)
        info.append(draft_info)
    target, target_info = _load_model(preset, "target", target_source, dtype, None, cuda)
    notes += _offload_notes(target)
    weights = preset.cpu_weights if cpu_weights is None else cpu_weights
    if weights == "gguf" and target.device.type == "cpu":  # before compiling: it changes the model
        target_info, gguf_notes = _use_gguf_weights(preset.target, target, target_info)
        notes += gguf_notes
    for name, value in preset.sampling:  # the API reads them for the fields a request omits
        setattr(target.generation_config, name, value)
    if gguf_weight_summary(target):  # before compiling: the compiled steps keep it
        notes += _four_bit_steps(target)
    if load_eagle is None:
        load_eagle = preset.drafter in ("eagle", "hybrid")
    if load_medusa is None:
        load_medusa = preset.drafter == "medusa"
    # Before compiling: the compiled steps return the features the heads read.
    heads = load_heads(preset, target, tokenizer, eagle=load_eagle, medusa=load_medusa)
    notes += heads.notes
    setting = preset.compile if compile is None else compile
    # A background compile runs in a helper process that loads this target as it was loaded here.
    helper = helper_command(CompileRecipe(preset, load_eagle=heads.eagle is not None,
                                          load_medusa=heads.medusa is not None,
                                          cpu_weights=weights)) if compile_in_background else None
    target_runner, draft_runner = decode_runners(preset, target, draft, setting, notes, heads.feature_layers(target), helper)
    info = [target_info, *info, *heads.info]
    for role, model, runner in (("target", target, target_runner), ("draft", draft, draft_runner)):
        if model is not None and runner is None:  # eager decoding; compiled steps pick their own kernels
            notes += _pack_for_cpu(role, model, info)
    return LoadedModels(
        preset=preset,
        tokenizer=tokenizer,
        target=target,
        draft=draft,
        info=info,
        notes=notes,
        draft_tokenizer=draft_tokenizer,
        target_runner=target_runner,
        draft_runner=draft_runner,
        eagle_head=heads.eagle,
        eagle_problem=heads.eagle_problem,
        medusa_heads=heads.medusa,
        medusa_problem=heads.medusa_problem,
    )


@quietly
def load_plain_target(name: str = AUTO, config_path=None, dtype: torch.dtype = torch.bfloat16):
    """The preset's target alone, on stock layers with its weights in `dtype`: no 4-bit kernels,
    no prepacking, no compiling. For bulk batched work, not for decoding: the EAGLE trainer's
    data, where a CPU's bf16 matrix units (AMX) run batched generation faster than the 4-bit
    kernels (measured on SmolLM2-135M: 32 rows at a short prompt 79 ms a step against 180; a
    whole data shard 29 s against 43). LoadError (one line) when it can't be loaded."""
    config = load_config(config_path)
    if name == AUTO:
        name, _ = choose_auto_preset(config)
    preset = config.find(name)
    source, _ = _source_and_tokenizer(preset.target, preset)
    model, _ = _load_model(preset, "target", source, dtype, None, torch.cuda.is_available())
    return model


def _use_gguf_weights(spec: ModelSpec, model, info: ModelInfo) -> tuple[ModelInfo, list[str]]:
    """Run the target's linear layers on its GGUF file's 4-bit blocks (see int4_linear): the
    updated ModelInfo, and one note where that can't be done here (fp32 weights run then)."""
    from ..kernels.int4_linear import HANDLED_TYPES, use_gguf_weights

    with load_errors(spec.label):
        path = gguf_file(spec)
    started = time.perf_counter()
    swap = use_gguf_weights(model, path)
    if swap.problem:
        return info, [f"target: fp32 weights, not the GGUF's 4-bit ones ({swap.problem})"]
    # one line per reason (a GGUF type with no int4 form says what it costs; see int4_linear.dense_reason)
    reasons = sorted(set(swap.kept.values()))
    notes = [f"target: {sum(w == why for w in swap.kept.values())} linear layers stay fp32 ({why})" for why in reasons]
    if not swap.swapped:
        return info, notes or [f"target: fp32 weights (no {', '.join(HANDLED_TYPES)} linear layers in the file)"]
    kinds = "+".join(sorted(swap.swapped)).lower()
    info = replace(info, quantization=f"gguf {kinds}", memory_bytes=model.get_memory_footprint(),
                   load_s=info.load_s + time.perf_counter() - started)
    return info, notes


def _four_bit_steps(model) -> list[str]:
    """The 4-bit target's logits are bf16 and tie often: switch it to row-exact attention (see
    row_attention), so a verify step breaks every tie as a 1-token step does, eager or compiled,
    and its decoding steps to lean decoder layers (see lean_layers); a note where that can't be done."""
    problem = use_row_exact_attention(model)
    if problem:
        return [f"target: stock attention ({problem}): at a tie of its bf16 logits, greedy speculative output "
                "may differ from plain decoding"]
    problem = use_lean_layers(model)
    return [f"target: transformers' decoder layers ({problem})"] if problem else []


def _pack_for_cpu(role: str, model, info: list[ModelInfo]) -> list[str]:
    """Prepack the fp32 linear layers of a CPU model for oneDNN (see packed_linear) and update
    its memory in `info` (a packed copy of a tied output embedding is extra); a note if that
    can't be done here."""
    from ..kernels.packed_linear import pack_linear_layers

    if model.device.type != "cpu":
        return []
    swapped, problem = pack_linear_layers(model)
    if problem:
        return [f"{role}: stock linear layers ({problem})"]
    if swapped:
        at = next(i for i, item in enumerate(info) if item.role == role)
        info[at] = replace(info[at], memory_bytes=model.get_memory_footprint())
    return []


def _preset_notes(preset: Preset, cuda: bool) -> list[str]:
    notes = []
    if preset.requires_gpu and not cuda:
        notes.append(f"{preset.name} is meant for a GPU and there is none: it runs on the CPU, slowly")
    if preset.trust_remote_code:
        notes.append(f"preset {preset.name} runs code shipped with its models (trust_remote_code: true)")
    return notes


# ---------------------------------------------------------------- models


def resolve_dtype(name: str, cuda: bool) -> torch.dtype:
    """auto: bf16 on CUDA (fp16 on GPUs without bf16), fp32 on CPU."""
    if name != "auto":
        return getattr(torch, name)
    if not cuda:
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def draft_quantization(kind: str, cuda: bool):
    """(BitsAndBytesConfig or None, a one-line note or None) for a draft quantization setting."""
    if kind == "none":
        return None, None
    from transformers import BitsAndBytesConfig
    from transformers.utils import is_bitsandbytes_available

    if not is_bitsandbytes_available():
        return None, f"bitsandbytes is not available here: the draft loads unquantized instead of {kind}"
    if kind == "8bit":
        # int8 matmuls on CPU cast fp32 inputs to fp16 and log that on every call.
        logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
        return BitsAndBytesConfig(load_in_8bit=True), None
    # bf16 compute: native on CUDA and what bitsandbytes' CPU kernels were measured with.
    return (
        BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
        ),
        None,
    )


def check_same_tokenizer(target_tokenizer, draft_tokenizer, target_name: str, draft_name: str) -> None:
    """Refuse a draft whose tokenizer maps tokens differently (padded model vocabularies may differ)."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab == draft_vocab:
        return
    differing = len(set(target_vocab.items()) ^ set(draft_vocab.items()))
    raise LoadError(
        f"draft {draft_name} and target {target_name} use different tokenizers "
        f"({len(draft_vocab)} vs {len(target_vocab)} tokens, {differing} mappings differ): "
        "pick a draft from the target's model family"
    )


def _source_and_tokenizer(spec: ModelSpec, preset: Preset):
    """Make the model loadable (download check, GGUF conversion) and load its tokenizer."""
    from transformers import AutoTokenizer

    with load_errors(spec.label):
        source = resolve(spec)
        tokenizer = AutoTokenizer.from_pretrained(
            source.path, local_files_only=source.local_files_only, trust_remote_code=preset.trust_remote_code
        )
    return source, tokenizer


def _load_model(
    preset: Preset, role: str, source: ResolvedSource, dtype: torch.dtype, quantization, cuda: bool
):
    """(model, ModelInfo) for the preset's target or draft."""
    from transformers import AutoModelForCausalLM

    spec = preset.target if role == "target" else preset.draft
    started = time.perf_counter()
    with load_errors(spec.label):
        model = AutoModelForCausalLM.from_pretrained(
            source.path,
            local_files_only=source.local_files_only,
            dtype=dtype,
            device_map=_device_map(role, cuda),
            quantization_config=quantization,
            trust_remote_code=preset.trust_remote_code,
        )
    model.eval()
    return model, model_info(model, role, spec.label, quantization, time.perf_counter() - started)


def _device_map(role: str, cuda: bool):
    if not cuda:
        return "cpu"  # bitsandbytes on CPU needs an explicit CPU placement
    return "auto" if role == "target" else {"": 0}


def model_info(model, role: str, name: str, quantization, load_s: float) -> ModelInfo:
    return ModelInfo(
        role=role,
        name=name,
        parameters=model.num_parameters(),  # counts 4-bit packed weights at full size
        memory_bytes=model.get_memory_footprint(),
        device=_devices(model),
        dtype=str(model.dtype).removeprefix("torch."),
        quantization=_quantization_name(quantization),
        load_s=load_s,
    )


def _quantization_name(quantization) -> str:
    if quantization is None:
        return "none"
    if getattr(quantization, "load_in_4bit", False):
        return quantization.bnb_4bit_quant_type
    return "int8"


def _devices(model) -> str:
    device_map = getattr(model, "hf_device_map", None) or {}
    devices = sorted({_device_name(d) for d in device_map.values()})
    return ",".join(devices) if len(devices) > 1 else str(model.device)


def _device_name(device) -> str:
    return f"cuda:{device}" if isinstance(device, int) else str(device)


def _offload_notes(model) -> list[str]:
    placed = {_device_name(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}
    if torch.cuda.is_available() and placed & {"cpu", "disk"}:
        return ["the target does not fit on the GPUs: part of it runs from CPU memory (slow); "
                "a smaller preset would fit"]
    return []
