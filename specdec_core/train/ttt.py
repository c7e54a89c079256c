"""EAGLE-3's training-time test: the head drafts several steps in a row, reading its own outputs,
exactly as it will when drafting, and every step is trained against the target.

For a sequence x_0..x_{n-1} with target features f_t, a draft chain starts at every position t:
  step 1 reads (embedding of x_{t+1}, fc(f_t)) at position t and predicts x_{t+2};
  step j reads (embedding of x_{t+j}, the head's own step j-1 output) at position t+j-1.
Step j of chain t attends to the real entries at positions <= t (step 1's keys, made from real
features, as in the drafter's cache after a verify) and to its own chain's entries of steps
2..j: the mask is causal over the first block of keys and diagonal over the later blocks. All
chains are computed at once with the head's own forward and KV cache.

A chain starts where the drafter's would: at the last prompt token or later (after the prefill
the head reads f_{P-1} and the first reply token). Step j is trained where position t+j still has
the target's distribution (t+j <= n-2), towards the target's softmax restricted to the draft
vocabulary (soft labels), weighted by 0.8^(j-1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from .dataset import Batch

STEP_WEIGHT = 0.8


def chain_mask(width: int, step: int) -> torch.Tensor:
    """[1, 1, width, step * width] bool: causal over step 1's keys, diagonal over later steps'."""
    positions = torch.arange(width)
    blocks = [positions[None, :] <= positions[:, None]]
    blocks += [torch.eye(width, dtype=torch.bool)] * (step - 1)
    return torch.cat(blocks, dim=1)[None, None]


def unrolled_outputs(head, embedding: torch.nn.Module, batch: Batch, steps: int) -> list[torch.Tensor]:
    """The head's pre-norm outputs [B, m, H] for draft steps 1..steps of every chain."""
    width = batch.width
    cache = DynamicCache()
    hidden = head.project(batch.aux)
    positions = torch.arange(width)[None].expand(len(batch.ids), -1)
    outputs = []
    for step in range(1, steps + 1):
        embeds = embedding(batch.ids[:, step : step + width])
        hidden = head(embeds, hidden, cache=cache, position_ids=positions + step - 1, attention_mask=chain_mask(width, step))
        outputs.append(hidden)
    return outputs


def step_masks(batch: Batch, steps: int, need_all: bool = False) -> list[torch.Tensor]:
    """[B, m] bool per step j: chain t starts at the last prompt token or later, and position t+j
    has a target distribution. need_all: only chains where every step has one."""
    t = torch.arange(batch.width)[None]
    start = t >= (batch.reply_starts[:, None] - 1)
    last = batch.lengths[:, None] - 2  # the last position with the target's features
    if need_all:
        return [start & (t + steps <= last)] * steps
    return [start & (t + step <= last) for step in range(1, steps + 1)]


def ttt_loss(head, embedding, draft_lm_head: torch.Tensor, batch: Batch, steps: int) -> tuple[torch.Tensor, dict]:
    """The weighted soft cross-entropy over all steps, and per-step (loss, top-1 agreement, count).

    draft_lm_head: [V_draft, H] the target's lm_head rows of the draft vocabulary (fp32)."""
    outputs = unrolled_outputs(head, embedding, batch, steps)
    total = torch.zeros(())
    report = {}
    for step, (out, mask) in enumerate(zip(outputs, step_masks(batch, steps)), start=1):
        if not mask.any():
            continue
        log_q = F.log_softmax(head.logits(out[mask]).float(), dim=-1)
        with torch.no_grad():
            target_hidden = batch.final[:, step : step + batch.width][mask].float()
            p = F.softmax(target_hidden @ draft_lm_head.T, dim=-1)
        loss = -(p * log_q).sum(-1).mean()
        total = total + STEP_WEIGHT ** (step - 1) * loss
        agree = (log_q.argmax(-1) == p.argmax(-1)).float().mean()
        report[step] = (float(loss.detach()), float(agree), int(mask.sum()))
    return total, report


@dataclass
class Acceptance:
    """Greedy acceptance by draft position over draft chains of length k."""

    k: int
    chains: int = 0
    accepted: list[int] = field(default_factory=list)  # accepted[i]: chains whose drafts 1..i+1 all matched

    def __post_init__(self):
        self.accepted = self.accepted or [0] * self.k

    @property
    def by_position(self) -> list[float]:
        return [a / max(self.chains, 1) for a in self.accepted]

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per round of k drafts (the bonus token not counted)."""
        return sum(self.by_position)

    def as_dict(self) -> dict:
        return {"k": self.k, "chains": self.chains, "by_position": [round(a, 4) for a in self.by_position],
                "mean_accepted": round(self.mean_accepted, 4)}


@torch.no_grad()
def measure_acceptance(head, embedding, batch: Batch, k: int, into: Acceptance) -> Acceptance:
    """Add the batch's chains to `into`. Draft j matches when the head's greedy token (mapped to
    the target's vocabulary) is the target's greedy token at t+j (batch.greedy) and is the
    sequence's next token (so on greedy sequences the chain read exactly the drafts it made)."""
    outputs = unrolled_outputs(head, embedding, batch, k)
    mask = step_masks(batch, k, need_all=True)[0]
    if not mask.any():
        return into
    token_ids = head.target_token_ids()
    alive = torch.ones(int(mask.sum()), dtype=torch.bool)
    for step, out in enumerate(outputs, start=1):
        draft = token_ids[head.logits(out[mask]).argmax(-1)]
        greedy = batch.greedy[:, step : step + batch.width][mask]
        following = batch.ids[:, step + 1 : step + 1 + batch.width][mask]
        alive &= (draft == greedy) & (following == greedy)
        into.accepted[step - 1] += int(alive.sum())
    into.chains += int(mask.sum())
    return into
