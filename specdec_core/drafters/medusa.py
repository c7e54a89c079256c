"""Medusa heads as the drafter: K heads on the target's last hidden state guess the next K tokens.

The engine hands over the target's features after each forward; this drafter reads one row:
the stream leaving the target's last layer (feature layer num_hidden_layers, the input of its
final norm) at the context's second-to-last position, the last one the target has read. The
target's final norm turns it into the hidden state its lm_head read to choose the context's
last token; head i reads it to guess the token i + 1 after that one (see medusa_heads). So a
round's chain is the heads' top guesses, one per head, from a single read; no cache, nothing
to catch up on.

Sampling: token i is drawn from head i's distribution, warped exactly as the target's
(sampling.probabilities), which the acceptance rule then takes as q. The heads don't look at
each other's tokens; that q is still the one the token was drawn from, so the output keeps the
target's distribution.

Readout: heads that carry their draft vocabulary (medusa_heads: the tokens they were trained to
guess among) read out through those rows only (of the target's lm_head, taken once at bind from
its own kernel, a 4-bit one's too; or of each head's own output layer); a head's logits for the
other tokens are -inf, so greedy, sampled and tree drafts all come from that vocabulary.
Otherwise the whole lm_head reads them out.

Trees: in greedy rounds that allow one, candidate_tree builds the tree of the heads' most likely
combinations (top TREE_WIDTH per head), so a wrong top guess at one depth can still be rescued by
that head's second or third.
"""

from __future__ import annotations

import torch

from ..decoding.base import decoder_of
from ..drafter import NO_DRAFT, Draft, Drafter
from ..errors import LoadError
from ..sampling import SamplingParams, probabilities, sample
from .candidate_tree import candidate_tree
from .medusa_heads import MedusaHeads


TREE_WIDTH = 4  # guesses per head a tree weighs (Medusa's published trees rarely go past a head's top 4 at depth 2+)


class MedusaDrafter(Drafter):
    """Drafts with Medusa heads (MedusaHeads) over the target's last hidden state."""

    name = "medusa"

    def __init__(self, heads: MedusaHeads, num_target_layers: int | None = None, source: str = "") -> None:
        """num_target_layers: the target's depth, so feature_layers is known before bind (the
        loader builds compiled steps that return this feature); else bind sets it."""
        self.heads = heads.eval()
        self.source = source or "Medusa heads"
        self.feature_layers = (num_target_layers,) if num_target_layers is not None else ()
        self._norm = self._lm_head = None  # the target's, shared (set in bind)
        # With the heads' draft vocabulary (set in bind): its ids, and the readout's rows for them
        # ([V', H] of the lm_head, or [K, V', H] of the heads' own output layers).
        self._draft_ids: torch.Tensor | None = None
        self._readout: torch.Tensor | None = None
        self._forget()

    @classmethod
    def from_pretrained(cls, folder, num_target_layers: int | None = None) -> MedusaDrafter:
        return cls(MedusaHeads.load(folder), num_target_layers, source=str(folder))

    # ---- the Drafter interface -----------------------------------------------------------

    def bind(self, target_model, tokenizer) -> None:
        text = target_model.config.get_text_config()
        heads, name = self.heads, self.source
        if heads.hidden_size != text.hidden_size:
            raise LoadError(f"Medusa heads {name} read hidden states {heads.hidden_size} wide but the target's are "
                            f"{text.hidden_size}: use heads trained for this target")
        lm_head = target_model.get_output_embeddings()
        if heads.own_output and heads.vocab_size != lm_head.out_features:
            raise LoadError(f"Medusa heads {name} guess over {heads.vocab_size} tokens but the target's vocabulary "
                            f"has {lm_head.out_features}: use heads trained for this target")
        if self.feature_layers not in ((), (text.num_hidden_layers,)):
            raise LoadError(f"Medusa heads {name} were set up for a target of {self.feature_layers[0]} layers, "
                            f"this one has {text.num_hidden_layers}")
        self.feature_layers = (text.num_hidden_layers,)
        self._norm, self._lm_head = decoder_of(target_model).norm, lm_head
        embed = target_model.get_input_embeddings().weight
        self.heads.to(device=embed.device, dtype=embed.dtype)
        self._draft_ids = self._readout = None
        if heads.draft_token_ids is not None:
            if heads.draft_token_ids[-1] >= lm_head.out_features:
                raise LoadError(f"Medusa heads {name} guess tokens up to id {heads.draft_token_ids[-1]} but the target's "
                                f"vocabulary has {lm_head.out_features}: use heads trained for this target")
            self._draft_ids = torch.tensor(heads.draft_token_ids, device=embed.device)
            if heads.own_output:  # each head's own rows
                self._readout = torch.stack([head[-1].weight[self._draft_ids] for head in heads.heads]).detach()
            else:  # the lm_head's rows, the same for every head (one matrix: a batched product over
                # it expanded per head cost 1.3 ms here, one product 0.4)
                self._readout = _lm_head_rows(lm_head, self._draft_ids, embed.dtype)
        self._forget()

    def reset(self, prompt_ids: list[int]) -> None:
        keep = self._row is not None and self._position == len(prompt_ids) - 2 and self._tokens[: len(prompt_ids) - 1] == prompt_ids[:-1]
        if not keep:
            self._forget()
        self._tokens = list(prompt_ids)

    def features_from(self) -> int | None:
        # The one row a round needs: the prompt's second-to-last position (re-read when not kept).
        if self._row is not None or len(self._tokens) < 2:
            return None
        return len(self._tokens) - 2

    def observe(self, features: torch.Tensor, position: int) -> None:
        if len(features):
            self._row, self._position = features[-1], position + len(features) - 1

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        if self._row is None or self._position != len(context) - 2:
            return NO_DRAFT  # no hidden state for the last position read: nothing to draft from
        logits = self._logits(min(k, self.heads.num_heads))  # a head's readout costs: only the k asked for
        tokens, dists = [], []
        for row in logits:
            if params.greedy:
                tokens.append(int(row.argmax()))
            else:
                dist = probabilities(row.float(), params)
                tokens.append(sample(dist, generator))
                dists.append(dist)
        return Draft(tokens, torch.stack(dists) if dists else None)

    def propose_tree(
        self, context: list[int], k: int, nodes: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        """Greedy rounds with room for a tree (nodes > k): the `nodes`-node tree of the most likely
        combinations of the first k heads' top-TREE_WIDTH guesses, each node one-hot at its token
        (the engine's tree rule takes distinct siblings so). Otherwise the chain of propose()."""
        if nodes <= k or not params.greedy:
            return self.propose(context, k, params, generator)
        if self._row is None or self._position != len(context) - 2:
            return NO_DRAFT
        depth = min(k, self.heads.num_heads)
        probs, ids = self._logits(depth).float().softmax(-1).topk(min(TREE_WIDTH, nodes), dim=-1)
        # A probability that underflows to 0 still ranks: keep scores inside (0, 1].
        tokens, parents = candidate_tree(ids.tolist(), probs.clamp_min(1e-30).tolist(), nodes)
        return Draft(tokens, parents=parents)

    def release(self, context: list[int] | None) -> None:
        if context is None:
            self._forget()
        else:
            self._tokens = list(context)

    # ---- internals -----------------------------------------------------------------------

    def _forget(self) -> None:
        self._row: torch.Tensor | None = None  # [H] the last layer's output at self._position
        self._position = -1
        self._tokens: list[int] = []

    def _logits(self, count: int) -> torch.Tensor:
        """[count, V] the first `count` heads' logits for their tokens (head i: the (i + 1)-th after
        the context's last token)."""
        with torch.inference_mode():
            row = self._row.to(self.heads.device)
            final = self._norm(row[None]).to(self.heads.dtype)  # the hidden state the target's lm_head read
            if self._readout is None:
                return self.heads.logits(final, self._lm_head, count)[:, 0]
            states = self.heads.hidden(final, count)[:, 0]  # [count, H]
            if self._readout.dim() == 2:
                drafted = torch.nn.functional.linear(states, self._readout)
            else:
                drafted = (states[:, None] @ self._readout[:count].transpose(1, 2))[:, 0]
            logits = states.new_full((count, self._lm_head.out_features), float("-inf"))
            logits[:, self._draft_ids] = drafted
            return logits


def _lm_head_rows(lm_head: torch.nn.Module, ids: torch.Tensor, dtype: torch.dtype, chunk: int = 128) -> torch.Tensor:
    """[len(ids), H] the rows of `lm_head`'s weight for the tokens `ids`, as its own kernel computes
    them (a quantised layer's too, whose weight is not a plain matrix): its outputs for the rows of
    the identity, in chunks (the whole [H, V] at once would be large for a big vocabulary)."""
    width = lm_head.in_features
    with torch.inference_mode():
        zero = lm_head(torch.zeros(1, width, dtype=dtype, device=ids.device))[0, ids]  # a bias, if any
        parts = [lm_head(torch.eye(width, dtype=dtype, device=ids.device)[start : start + chunk])[:, ids] - zero
                 for start in range(0, width, chunk)]
        return torch.cat(parts).T.contiguous()
