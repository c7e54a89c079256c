"""What one run of the GPU check is made of: its scale (shapes and sizes; FULL on a GPU, TINY on
a CPU for the test), and the parts' record of checks, each pass / fail / not run."""

from __future__ import annotations

from dataclasses import dataclass, field

PASS, FAIL, NOT_RUN = "pass", "fail", "not run"


@dataclass(frozen=True)
class Scale:
    """Shapes and sizes of one run of the check."""

    device: str
    target: str  # a name of architectures.ARCHITECTURES
    draft: str
    prompts: int = 3
    prompt_tokens: int = 96
    new_tokens: int = 48
    draft_layers: int = 2  # the correctness draft: the target's first layers (agrees often)
    loading_target: str = "qwen2.5-0.5b"  # saved to disk for the loading and app parts
    eagle_target: str = "llama-3.1-8b"  # the EAGLE-3 head's c is measured over this target
    eagle_draft: str = "llama-3.2-1b"
    ceiling_acceptances: tuple = (0.6, 0.8, 0.9)
    ceiling_tokens: int = 96
    cost_repeats: int = 20
    context: int = 256
    backend: str = "inductor"  # torch.compile's; TINY only traces the steps ("eager"): CI has no time for codegen


FULL = Scale(device="cuda", target="qwen2.5-7b", draft="qwen2.5-0.5b")
TINY = Scale(device="cpu", target="tiny", draft="tiny-draft", prompts=2, prompt_tokens=16, new_tokens=16,
             draft_layers=1, loading_target="tiny", eagle_target="tiny", eagle_draft="tiny-draft",
             ceiling_acceptances=(0.8,), ceiling_tokens=16, cost_repeats=2, context=16, backend="eager")


@dataclass
class Check:
    name: str
    status: str
    detail: str = ""


@dataclass
class Part:
    name: str
    status: str = NOT_RUN
    reason: str = ""
    seconds: float = 0.0
    checks: list[Check] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def check(self, name: str, ok: bool | None, detail: str = "") -> bool:
        """Record one check: True pass, False fail, None not run."""
        self.checks.append(Check(name, NOT_RUN if ok is None else PASS if ok else FAIL, detail))
        return bool(ok)
