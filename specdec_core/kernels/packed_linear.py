"""Linear layers on CPU with their weights prepacked for oneDNN, for decoding's few-row inputs.

Decoding multiplies each weight matrix by 1 to 9 rows (a token, or a token plus its drafts).
PyTorch's stock fp32 CPU linear is slow at that shape (for SmolLM2-135M a step over 1+4 tokens
cost 1.7x a 1-token step). With every weight laid out once, at load, in oneDNN's blocked format
(what torch.compile's CPU weight freezing does) both steps are faster and the verify step is
nearly as cheap as the 1-token one (`python -m specdec_core.cost_model --modes eager,packed`,
docs/bench/cost_model_cpu.md): plain decoding gets faster, and verifying drafts gets cheaper relative to
it, which is what speculation needs.

`pack_linear_layers(model)` swaps every fp32 `nn.Linear` of a CPU model for a PackedLinear in
place. A different kernel sums in a different order, so logits move by float rounding (about
1e-6) exactly as with any other kernel or thread count; everything that decodes with the
model, baseline and speculative alike, then runs the same kernel. Off x86-64 (not measured
there), or where oneDNN's ops are missing or disagree with the stock linear, nothing is swapped
and the reason is returned.
"""

from __future__ import annotations

import platform
from functools import cache

import torch
from torch import nn

_ROWS_HINT = 4  # oneDNN picks its blocking for this many input rows; 2..4 measured alike
_AGREEMENT = dict(rtol=1e-4, atol=1e-5)  # stock vs packed on the self-check, fp32


class PackedLinear(nn.Module):
    """An fp32 linear layer whose weight is held in oneDNN's blocked layout."""

    def __init__(self, linear: nn.Linear, keep_weight: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        if keep_weight:  # for code that reads it (the output embedding's, usually tied anyway)
            self.weight = linear.weight
        weight = linear.weight.detach()
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, _ROWS_HINT))
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linear_layers(model: nn.Module) -> tuple[int, str | None]:
    """Swap the fp32 CPU `nn.Linear`s of `model` for PackedLinears, in place.

    Returns (how many were swapped, why none were swapped or None). Quantized layers
    (bitsandbytes subclasses nn.Linear), other dtypes and other devices are left as they are.
    The output embedding keeps its `weight` too (code reads its shape; when tied, as in small
    models, it is the input embedding's and costs nothing); the other layers' weights are freed.
    """
    problem = packing_problem()
    if problem:
        return 0, problem
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _packable(child):
                setattr(parent, name, PackedLinear(child, keep_weight=child is head))
                swapped += 1
    return swapped, None


def has_packed_layers(model: nn.Module) -> bool:
    return any(isinstance(module, PackedLinear) for module in model.modules())


def _packable(module: nn.Module) -> bool:
    if type(module) is not nn.Linear:  # exactly: subclasses are quantized or otherwise special
        return False
    weight = module.weight
    return weight.dtype == torch.float32 and weight.device.type == "cpu"


@cache
def packing_problem() -> str | None:
    """Why weights can't be packed in this torch build, or None: the ops must exist and agree
    with the stock linear on a small random layer."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"measured faster on x86-64 only, this is {platform.machine()}"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN"
    generator = torch.Generator().manual_seed(0)  # its own: loading must not move the global seed
    linear = nn.utils.skip_init(nn.Linear, 64, 48)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 64, generator=generator))
        linear.bias.copy_(torch.randn(48, generator=generator))
    rows = torch.randn(1, 3, 64, generator=generator)
    try:
        with torch.inference_mode():
            packed, stock = PackedLinear(linear)(rows), linear(rows)
    except (RuntimeError, AttributeError, NotImplementedError) as error:
        return f"oneDNN's linear failed here ({str(error).splitlines()[0] if str(error) else type(error).__name__})"
    if packed.shape != stock.shape or not torch.allclose(packed, stock, **_AGREEMENT):
        return "oneDNN's linear disagrees with the stock one here"
    return None
