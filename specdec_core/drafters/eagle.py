"""An EAGLE-3 head as the drafter: it drafts from the target's own features.

Each round the head first reads the pairs it has not read yet: (target features at position j,
token j+1) for every position whose features the last target forwards produced (the prefill, the
verify of the last round, only the accepted part). Its output at the last pair predicts the next
token; each later draft step feeds the head its own output and the drafted token's embedding.
Those draft steps are cropped from the head's cache after the round: the next round re-reads the
accepted positions with the target's true features, as EAGLE does.

Sampling: q is the head's distribution over its draft vocabulary, put on the target vocabulary
through d2t (zero elsewhere) and warped exactly as the target's (sampling.probabilities), so the
acceptance rule keeps the output distribution exact.

Trees (propose_tree, EAGLE-2's dynamic tree): level by level, the `width` nodes of the newest
level with the highest confidence (the product of the head's probabilities along their path) are
fed to the head in one pass, each row attending to the head's cache and its own ancestors (a tree
mask), and each gets its `width` likeliest children. Of every candidate the `nodes` most
confident are kept; a child is never more confident than its parent, so they form a tree. The
tree is a deterministic function of the head's probabilities: its tokens go to the target as a
deterministic drafter's (q one-hot at each token), for which recursive rejection over siblings
is exact, so sampled rounds keep the target's distribution too. The head's tree steps are
cropped like the chain's: the accepted path's true features come back through observe().
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import LoadError
from ..decoding.eager import cache_memory_bytes, growing_cache, shared_prefix_length
from ..sampling import SamplingParams, probabilities, sample
from ..drafter import NO_DRAFT, Draft, Drafter
from .eagle_head import Eagle3Head

TREE_WIDTH = 4  # children per expanded node, and nodes expanded per level (EAGLE-2 uses 8-10 on a GPU)

_HEAD_FILES = ["config.json", "*.safetensors", "pytorch_model.bin"]


class EagleDrafter(Drafter):
    """Drafts with an EAGLE-3 head (Eagle3Head) over the target's features at three layers."""

    name = "eagle"

    def __init__(self, head: Eagle3Head, source: str = "") -> None:
        self.head = head.eval()
        self.source = source or "EAGLE-3 head"
        self.feature_layers = head.layer_ids
        self._embed = None  # the target's input embedding, shared (set in bind)
        self._target_vocab = 0
        self._forget()

    @classmethod
    def from_pretrained(cls, path_or_hub_id: str | Path, local_files_only: bool = False) -> EagleDrafter:
        """Load a head saved in the EAGLE-3 format from a folder or a hub repo id (downloaded
        into the hub cache once). Raises LoadError (one line) when it can't."""
        return cls(Eagle3Head.load(head_folder(path_or_hub_id, local_files_only)), source=str(path_or_hub_id))

    # ---- the Drafter interface -----------------------------------------------------------

    def bind(self, target_model, tokenizer) -> None:
        text = target_model.config.get_text_config()
        head, name = self.head, self.source
        if head.target_hidden_size != text.hidden_size:
            raise LoadError(
                f"EAGLE head {name} reads features {head.target_hidden_size} wide but the target's hidden "
                f"size is {text.hidden_size}: use a head trained for this target"
            )
        embed = target_model.get_input_embeddings()
        if head.config.vocab_size != text.vocab_size or head.config.hidden_size != embed.weight.shape[1]:
            raise LoadError(
                f"EAGLE head {name} is for a vocabulary of {head.config.vocab_size} tokens and embeddings "
                f"{head.config.hidden_size} wide, the target has {text.vocab_size} and {embed.weight.shape[1]}: "
                "use a head trained for this target"
            )
        if max(self.feature_layers) >= text.num_hidden_layers:
            raise LoadError(
                f"EAGLE head {name} reads target layers {list(self.feature_layers)} but the target has "
                f"{text.num_hidden_layers}: use a head trained for this target"
            )
        self._embed = embed
        self._target_vocab = target_model.get_output_embeddings().out_features  # an int4 head has no .weight
        self.head.to(device=embed.weight.device, dtype=embed.weight.dtype)
        self._target_ids = self.head.target_token_ids()
        self._forget()

    def reset(self, prompt_ids: list[int]) -> None:
        """Keep what the head read of the last sequence as far as the new one agrees with it."""
        shared = shared_prefix_length(self._tokens, prompt_ids)
        valid_pairs = min(self._pairs, max(shared - 1, 0))  # pair j also reads token j+1
        if valid_pairs < self._pairs:
            self._crop(valid_pairs)
            self._pending.keep(0)  # began after the pairs just dropped
        else:
            self._pending.keep(max(shared - self._pairs, 0))
        self._tokens = list(prompt_ids)
        self._fresh = 0

    def features_from(self) -> int:
        return self._pairs + len(self._pending)

    def observe(self, features: torch.Tensor, position: int) -> None:
        have = self.features_from()
        if position > have:  # a gap: positions never seen; start over from what the engine has
            self._forget()
            self._blind = True
            return
        new = features[have - position :].to(self.head.device)  # a sharded target's layers differ
        # Rows of the prompt (the prefill) are catch-up; a verify's rows are read by the next round.
        in_prompt = position + len(features) <= len(self._tokens) - 1
        self._fresh = 0 if in_prompt else len(new)
        self._pending.append(new)

    def lag(self, context: list[int]) -> int:
        # The positions the last verify produced are read by the round itself; older ones
        # (a new prompt, plain rounds while paused) are catch-up.
        return max(self._readable(context) - self._fresh, 0)

    def catch_up(self, context: list[int]) -> None:
        self._read(context, self._readable(context) - self._fresh)

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        self._read(context, self._readable(context))
        if self._blind or self._pairs == 0 or self._pairs < len(context) - 1:
            return NO_DRAFT  # no features for the last position: nothing to draft from
        out = self._last_out
        tokens: list[int] = []
        dists: list[torch.Tensor] = []
        with torch.inference_mode():
            for i in range(k):
                token, dist = self._choose(self.head.logits(out), params, generator)
                tokens.append(token)
                if dist is not None:
                    dists.append(dist)
                if i + 1 < k:  # the last draft token is never fed
                    embeds = self._embed(torch.tensor([[token]], device=out.device))
                    out = self.head(embeds, out[None, None], self._cache)[0, -1]
        self._cache_crop(self._pairs)  # the draft steps read the head's own guesses: drop them
        return Draft(tokens, torch.stack(dists) if dists else None)

    def propose_tree(
        self, context: list[int], k: int, nodes: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        """EAGLE-2's dynamic tree of at most `nodes` tokens, k deep (see the module docstring);
        the chain when trees are off (nodes < 2) or the tree could only be a chain (k < 2)."""
        if nodes < 2 or k < 2:
            return self.propose(context, k, params, generator)
        self._read(context, self._readable(context))
        if self._blind or self._pairs == 0 or self._pairs < len(context) - 1:
            return NO_DRAFT
        with torch.inference_mode():
            candidates = self._grow_tree(k, min(TREE_WIDTH, nodes), params)
        self._cache_crop(self._pairs)  # the tree steps read the head's own guesses: drop them
        return _best_subtree(candidates, nodes)

    def memory_bytes(self) -> int:
        """Bytes of the head's KV cache now."""
        return cache_memory_bytes(self._cache)

    def release(self, context: list[int] | None) -> None:
        if context is None:
            self._forget()
        else:
            self._tokens = list(context)
        self._blind = False

    # ---- internals -----------------------------------------------------------------------

    def _forget(self) -> None:
        self._cache = growing_cache(self.head.config)
        self._pairs = 0  # pairs (features j, token j+1) the head's cache holds: j = 0 .. pairs-1
        self._last_out: torch.Tensor | None = None  # [H] the head's output at the last pair
        self._pending = _Rows()  # [p, F] features of positions pairs .. pairs+p-1
        self._tokens: list[int] = []  # the sequence all this belongs to
        self._fresh = 0  # rows of the latest observe (the last verify's)
        self._blind = False

    def _readable(self, context: list[int]) -> int:
        """Pending pairs whose next token is already in the context."""
        return max(min(len(self._pending), len(context) - 1 - self._pairs), 0)

    def _read(self, context: list[int], count: int) -> None:
        """Feed the head the next `count` pending pairs in one pass."""
        if count <= 0:
            return
        start = self._pairs
        features = self._pending.pop(count)
        tokens = torch.tensor([context[start + 1 : start + 1 + count]], device=features.device)
        with torch.inference_mode():
            hidden = self.head.project(features)[None]
            out = self.head(self._embed(tokens), hidden, self._cache)
        self._last_out = out[0, -1]
        self._pairs += count
        self._fresh = min(self._fresh, len(self._pending))

    def _crop(self, pairs: int) -> None:
        """Keep the first `pairs` pairs (a new sequence that agrees only that far)."""
        if pairs == 0:
            self._cache, self._last_out = growing_cache(self.head.config), None
        else:
            # The output at pair pairs-1 was not kept: re-read that pair from its features,
            # which are gone too; so drop it as well and let the target's prefill resend it.
            pairs -= 1
            self._cache_crop(pairs)
            self._last_out = None
        self._pairs = pairs

    def _cache_crop(self, keep: int) -> None:
        surplus = self._cache.get_seq_length() - keep
        if surplus > 0:
            self._cache.crop(-surplus)

    def _grow_tree(self, depth: int, width: int, params: SamplingParams) -> list[_Node]:
        """Every candidate node of a tree `depth` levels deep: each level's `width` most
        confident nodes are expanded (one head pass over them), `width` children each."""
        candidates: list[_Node] = []
        level = self._children(None, self._last_out, width, params, candidates)
        for level_depth in range(1, depth):
            expand = sorted(level, key=lambda n: -n.log_conf)[:width]
            outs = self._feed_level(expand, candidates, level_depth)
            level = []
            for node, out in zip(expand, outs):
                level += self._children(node, out, width, params, candidates)
        return candidates

    def _children(self, parent: _Node | None, out: torch.Tensor, width: int, params: SamplingParams,
                  candidates: list[_Node]) -> list[_Node]:
        """The `width` likeliest next tokens after `parent`'s path (None: the context), added to
        `candidates`. Sampling ranks by the head's warped distribution, the one it would draw from."""
        logits = self.head.logits(out).float()
        log_q = torch.log_softmax(logits, -1) if params.greedy else torch.log(probabilities(logits, params))
        top = torch.topk(log_q, width)
        base = parent.log_conf if parent is not None else 0.0
        children = []
        for value, draft_id in zip(top.values.tolist(), top.indices.tolist()):
            if value == float("-inf"):
                break  # outside top-k/top-p: the target would never keep it
            children.append(_Node(len(candidates), int(self._target_ids[draft_id]), parent, base + value))
            candidates.append(children[-1])
        return children

    def _feed_level(self, level: list[_Node], candidates: list[_Node], depth: int) -> torch.Tensor:
        """One head pass over a level's nodes (all `depth` deep): each reads its token and its
        parent's output at position pairs + depth - 1, attending to the head's cache of real pairs
        and to its ancestors' rows of this tree. Returns their outputs [len(level), H]."""
        past = self._cache.get_seq_length()
        device = self.head.device
        mask = torch.zeros(1, 1, len(level), past + len(level), dtype=torch.bool, device=device)
        mask[..., : self._pairs] = True
        for row, node in enumerate(level):
            node.column = past + row
            ancestor = node
            while ancestor is not None and ancestor.column is not None:
                mask[0, 0, row, ancestor.column] = True
                ancestor = ancestor.parent
        hidden = torch.stack([n.parent.out if n.parent is not None else self._last_out for n in level])
        embeds = self._embed(torch.tensor([[n.token for n in level]], device=device))
        positions = torch.full((1, len(level)), self._pairs + depth - 1, device=device)
        outs = self.head(embeds, hidden[None], self._cache, position_ids=positions, attention_mask=mask)[0]
        for node, out in zip(level, outs):
            node.out = out
        return outs

    def _choose(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator):
        """One draft token (a target id) and its [V_target] distribution (None when greedy)."""
        if params.greedy:
            return int(self._target_ids[int(logits.argmax())]), None
        on_target = logits.new_full((self._target_vocab,), float("-inf"))
        on_target[self._target_ids] = logits  # q = 0 on tokens outside the draft vocabulary
        dist = probabilities(on_target.float(), params)
        return sample(dist, generator), dist


@dataclass(eq=False)
class _Node:
    """A candidate tree node: its index among the candidates, target token, parent (None: the
    context), log confidence (summed log q along its path), and once fed to the head its output
    and its column in the head's cache."""

    index: int
    token: int
    parent: _Node | None
    log_conf: float
    out: torch.Tensor | None = None
    column: int | None = None


def _best_subtree(candidates: list[_Node], nodes: int) -> Draft:
    """The `nodes` most confident candidates as a Draft tree (parents before children). A node
    is never more confident than its parent, and among equals the shallower, earlier one wins,
    so every kept node's parent is kept."""
    def depth(node: _Node) -> int:
        return 0 if node.parent is None else 1 + depth(node.parent)

    best = sorted(candidates, key=lambda n: (-n.log_conf, depth(n), n.index))[:nodes]
    order: dict[int, int] = {}
    ranked = []
    for node in sorted(best, key=lambda n: (depth(n), n.index)):  # topological: by depth
        if node.parent is None or id(node.parent) in order:  # always, but for rounding: never an orphan
            order[id(node)] = len(ranked)
            ranked.append(node)
    parents = [order[id(n.parent)] if n.parent is not None else -1 for n in ranked]
    return Draft([n.token for n in ranked], None, parents)


class _Rows:
    """A queue of feature rows, kept as the chunks they came in: a round appends a few rows while
    the head is paused, and joining them into one tensor each time copied them all again (0.26 ms
    a round at 800 pending rows of the offline head, against 0.014 ms for the append); they are
    joined once, when the head reads them."""

    def __init__(self) -> None:
        self._chunks: list[torch.Tensor] = []
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    def append(self, rows: torch.Tensor) -> None:
        if len(rows):
            self._chunks.append(rows)
            self._rows += len(rows)

    def keep(self, count: int) -> None:
        """Drop every row after the first `count`."""
        if count < self._rows:
            self._chunks = [self._join()[:count]] if count > 0 else []
            self._rows = max(count, 0)

    def pop(self, count: int) -> torch.Tensor:
        """Remove and return the first `count` rows (0 < count <= len)."""
        joined = self._join()
        rest = joined[count:]
        self._chunks, self._rows = ([rest] if len(rest) else []), len(rest)
        return joined[:count]

    def _join(self) -> torch.Tensor:
        if len(self._chunks) > 1:
            self._chunks = [torch.cat(self._chunks)]
        return self._chunks[0]


def head_folder(path_or_hub_id: str | Path, local_files_only: bool = False, what: str = "EAGLE head",
                patterns: list[str] = _HEAD_FILES) -> Path:
    """A local folder holding the head: the path itself, or the hub repo's files (`patterns`) in
    the hub cache. `what` names the head in messages (Medusa heads use this too)."""
    path = Path(path_or_hub_id).expanduser()
    text = str(path_or_hub_id)
    if path.exists() or text.startswith(("/", ".", "~")) or text.count("/") != 1:
        return path
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(text, allow_patterns=patterns, local_files_only=True))
    except Exception:
        if local_files_only:
            raise LoadError(f"{what} {text} is not in the local hub cache: download it first (`hf download {text}`)") from None
    try:
        return Path(snapshot_download(text, allow_patterns=patterns))
    except Exception as error:
        raise LoadError(
            f"{what} {text} could not be downloaded ({type(error).__name__}): check the name and the "
            f"network, or download it first (`hf download {text}`)"
        ) from None
