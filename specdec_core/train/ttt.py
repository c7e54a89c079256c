"""EAGLE-3's training-time test: the head drafts several steps in a row, reading its own outputs,
exactly as it will when drafting, and every step is trained against the target.

For a sequence x_0..x_{n-1} with target features f_t, a draft chain starts at every position t:
  step 1 reads (embedding of x_{t+1}, fc(f_t)) at position t and predicts x_{t+2};
  step j reads (embedding of x_{t+j}, the head's own step j-1 output) at position t+j-1.
Step j of chain t attends to the real entries at positions <= t (step 1's keys, made from real
features, as in the drafter's cache after a verify) and to its own chain's entries of steps
2..j. All chains of a batch are computed at once with the head's own layer (its pieces, with the
attention done here): step 1's keys at every position, everything else only at the chains trained,
each chain's own entries attended as dot products rather than as masked diagonal blocks.

A chain starts where the drafter's would: at the last prompt token or later (after the prefill
the head reads f_{P-1} and the first reply token). Step j is trained where position t+j still has
the target's distribution (t+j <= n-2), towards the target's softmax restricted to the draft
vocabulary (soft labels), weighted by 0.8^(j-1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .dataset import Batch

STEP_WEIGHT = 0.8


@dataclass(frozen=True)
class Chains:
    """The draft chains a pass computes: in row b, those starting at t = first[b] + i for
    i < count[b], laid out [B, w] (w = the largest count; the slots past a row's count are padding)."""

    first: torch.Tensor  # [B]
    count: torch.Tensor  # [B]

    @property
    def width(self) -> int:
        return max(int(self.count.max()), 1)

    @property
    def valid(self) -> torch.Tensor:
        """[B, w] bool: the slot holds a chain."""
        return torch.arange(self.width)[None] < self.count[:, None]

    def starts(self, limit: int) -> torch.Tensor:
        """[B, w] each slot's chain start t (padding slots clamped below `limit`, so they index)."""
        return (self.first[:, None] + torch.arange(self.width)[None]).clamp(max=limit - 1)


def trained_chains(batch: Batch, steps: int, need_all: bool = False) -> Chains:
    """The chains step 1 is trained on: they start at the last prompt token or later, and
    position t+1 has a target distribution (t+1 <= n-2). need_all: every step's position does."""
    first = (batch.reply_starts - 1).clamp(min=0)
    last = batch.lengths - 2 - (steps if need_all else 1)
    return Chains(first=first, count=(last - first + 1).clamp(min=0))


def step_masks(batch: Batch, chains: Chains, steps: int) -> list[torch.Tensor]:
    """[N] bool per step j over the chains (in chain_outputs' order): position t+j has a target
    distribution."""
    t = chains.starts(batch.width)[chains.valid]
    last = batch.lengths[:, None].expand(-1, chains.width)[chains.valid] - 2  # the last position with the target's features
    return [t + step <= last for step in range(1, steps + 1)]


def chain_outputs(head, embedding: torch.nn.Module, batch: Batch, steps: int, chains: Chains) -> list[torch.Tensor]:
    """The head's pre-norm outputs [N, H] for draft steps 1..steps of the N chains (row by row,
    by start).

    Only the keys and values of step 1 are computed at every position (every chain reads them);
    the rest of step 1 and steps 2..k only at the chains (most positions are prompt, and no chain
    starting there is trained). The chains are packed for the layer's matmuls and laid out
    [B, w] (w: a row's most chains) for the attention."""
    layer, width, valid = head.midlayer, batch.width, chains.valid
    t = chains.starts(width)
    rows = torch.arange(len(batch.ids))[:, None].expand_as(t)[valid]
    prefix = (torch.arange(width)[None, None] <= t[:, :, None])[:, None]  # [B, 1, w, m]: keys at positions <= t
    t = t[valid]
    # The fp16 features straight to the matmul's dtype (under autocast bf16: one cast, not two).
    features = batch.aux.to(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else head.dtype)
    x_all, residual_all = layer.attention_input(embedding(batch.ids[:, 1 : 1 + width]).to(head.dtype), head.fc(features))
    every = torch.arange(width)[None].expand(len(batch.ids), -1)
    keys, values = layer.keys_values(x_all, head.rotary_emb(x_all, every))
    x, residual = x_all[rows, t], residual_all[rows, t]
    own_keys, own_values, outputs = [], [], []
    for step in range(1, steps + 1):
        if step > 1:
            x, residual = layer.attention_input(embedding(batch.ids[rows, t + step]).to(head.dtype), hidden)
        rotary = head.rotary_emb(x[None], (t + step - 1)[None])
        queries = _window(layer.queries(x[None], rotary), valid)
        if step > 1:  # the chain's own entry of this step: its query attends to it too
            key, value = layer.keys_values(x[None], rotary)
            own_keys.append(_window(key, valid))
            own_values.append(_window(value, valid))
        attended = _chain_attention(queries, keys, values, prefix, own_keys, own_values, layer.self_attn.scaling)
        hidden = layer.finish(residual, layer.self_attn.o_proj(attended[valid]))
        outputs.append(hidden)
    return outputs


def _window(packed: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[1, heads, N, d] packed chains -> [B, heads, w, d] (zeros where a row has fewer chains)."""
    states = packed[0].transpose(0, 1)
    laid = states.new_zeros(*valid.shape, *states.shape[1:])
    laid[valid] = states
    return laid.transpose(1, 2)


def _chain_attention(queries, keys, values, prefix, own_keys, own_values, scaling) -> torch.Tensor:
    """Each chain's query [B, h, w, d] over step 1's keys [B, kv, m, d] at positions <= its start
    (a masked matmul) and over its own entries of steps 2..j (a dot product each, not a masked
    [w, w] block per step); one softmax over both. Returns [B, w, h * d]."""
    batch, heads, width, dim = queries.shape
    groups, m = heads // keys.shape[1], keys.shape[2]
    queries = queries * scaling
    # Grouped-query attention without repeating the keys: a kv head's query heads side by side.
    scores = (queries.reshape(batch, -1, groups * width, dim) @ keys.transpose(-1, -2)).view(batch, heads, width, m)
    scores = scores.masked_fill(~prefix, float("-inf"))
    if own_keys:
        own_k = torch.stack(own_keys, dim=-2).repeat_interleave(groups, dim=1)  # [B, h, w, j-1, d]
        scores = torch.cat([scores, (queries[..., None, :] * own_k).sum(-1).to(scores.dtype)], dim=-1)
    # bf16 scores: CPU's softmax accumulates in fp32 anyway, and asking for fp32 output costs 4x.
    weights = scores.softmax(-1).to(values.dtype)
    out = (weights[..., :m].reshape(batch, -1, groups * width, m) @ values).view(batch, heads, width, dim)
    if own_keys:
        own_v = torch.stack(own_values, dim=-2).repeat_interleave(groups, dim=1)
        out = out + (weights[..., m:, None] * own_v).sum(-2)
    return out.transpose(1, 2).flatten(2)


def ttt_loss(head, embedding, draft_lm_head: torch.Tensor, batch: Batch, steps: int) -> tuple[torch.Tensor, dict]:
    """The weighted soft cross-entropy over all steps, and per-step (loss, top-1 agreement, count).

    draft_lm_head: [V_draft, H] the target's lm_head rows of the draft vocabulary (fp32)."""
    chains = trained_chains(batch, steps)
    outputs = chain_outputs(head, embedding, batch, steps, chains)
    targets, slots = _target_distributions(batch, chains, steps, draft_lm_head)
    target_top = targets.max(-1).indices
    total = torch.zeros(())
    report = {}
    for step, (out, mask) in enumerate(zip(outputs, step_masks(batch, chains, steps)), start=1):
        if not mask.any():
            continue
        logits = head.logits(out[mask])
        chosen = slots[:, step - 1 : step - 1 + chains.width][chains.valid][mask]  # the rows of `targets` at t + step
        loss, top = _SoftCrossEntropy.apply(logits, targets[chosen])
        total = total + STEP_WEIGHT ** (step - 1) * loss
        agree = (top == target_top[chosen]).float().mean()
        report[step] = (float(loss.detach()), float(agree), int(mask.sum()))
    return total, report


@torch.no_grad()
def _target_distributions(batch: Batch, chains: Chains, steps: int, draft_lm_head: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's softmax over the draft vocabulary [K, V_draft] (fp32) at every position a step
    is trained towards, each computed once (step j of chain t and step j+1 of chain t-1 share
    position t+j), and [B, w + steps - 1] the row of each position first + 1 + u (-1: none)."""
    span = chains.width + steps - 1
    positions = chains.first[:, None] + 1 + torch.arange(span)[None]
    needed = (torch.arange(span)[None] < (chains.count[:, None] + steps - 1)) & (chains.count[:, None] > 0)
    needed &= positions <= batch.lengths[:, None] - 2  # the last position with the target's features
    rows = torch.arange(len(batch.ids))[:, None]
    hidden = batch.final[rows, positions.clamp(max=batch.final.shape[1] - 1)][needed].float()
    slots = torch.full(needed.shape, -1, dtype=torch.long)
    slots[needed] = torch.arange(int(needed.sum()))
    return F.softmax(hidden @ draft_lm_head.T, dim=-1), slots


class _SoftCrossEntropy(torch.autograd.Function):
    """mean over rows of -sum(p * log_softmax(logits)), as lse(logits) - p . logits (p sums to
    1), with the gradient (softmax(logits) - p) / rows kept from the forward: a few passes over
    the [rows, vocabulary] logits instead of log_softmax's, the product's and their backwards'
    (at the 8,192-token draft vocabulary the loss was a third of a step). Also returns each
    row's top draft token (the softmax's argmax, for the agreement)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits32 = logits.float()
        q = logits32.softmax(-1)
        top = q.max(-1)
        # lse = logit - log q at any token; at the top one q is largest, so its log is exact.
        lse = logits32.gather(-1, top.indices[:, None])[:, 0] - top.values.log()
        loss = (lse - torch.linalg.vecdot(p, logits32)).mean()
        ctx.save_for_backward(q.sub_(p))
        ctx.logits_dtype = logits.dtype
        ctx.mark_non_differentiable(top.indices)
        return loss, top.indices

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _):
        (difference,) = ctx.saved_tensors
        return (difference * (grad / len(difference))).to(ctx.logits_dtype), None


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
    chains = trained_chains(batch, k, need_all=True)
    mask = chains.valid
    if not mask.any():
        return into
    outputs = chain_outputs(head, embedding, batch, k, chains)
    rows, t = torch.arange(len(batch.ids))[:, None].expand_as(mask)[mask], chains.starts(batch.width)[mask]
    token_ids = head.target_token_ids()
    alive = torch.ones(int(mask.sum()), dtype=torch.bool)
    for step, out in enumerate(outputs, start=1):
        draft = token_ids[head.logits(out).argmax(-1)]
        greedy = batch.greedy[rows, t + step]
        following = batch.ids[rows, t + step + 1]
        alive &= (draft == greedy) & (following == greedy)
        into.accepted[step - 1] += int(alive.sum())
    into.chains += int(mask.sum())
    return into
