"""The eager decode path: a causal LM together with the KV cache it owns (CachedModel), forward
new tokens, crop on rollback; and a model's runner kept from one generation to the next.

Position is the state: the cache holds the first `length` tokens of the sequence and nothing
else reaches into it. Rolling back after rejected drafts is a crop, never a recomputation.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .base import EAGER_DYNAMIC, MAX_TREE_NODES, DecodePath, model_name
from .tree import TREE_KWARG, check_parents, row_depths, tree_attention_mask

# The attention implementations that verify a tree, and the most nodes each takes: the stock ones
# apply a custom 4D mask as given (transformers 5 hands a 4D mask to them unchanged); others add
# themselves (allow_trees). Flash-attention kernels, for one, take no mask and can't.
TREE_ATTENTION = {"sdpa": MAX_TREE_NODES, "eager": MAX_TREE_NODES}
# Those that verify a tree by the 4D mask alone, whatever the cache: a static cache's step (static.py)
# hands them one over all its slots (row-exact attention computes rows of a growing cache).
MASKED_TREE_ATTENTION = ("sdpa", "eager")
# Those that verify a tree in a compiled step too (compiled.py), and the most nodes: there the tree
# comes as each row's path, tensors under TREE_KWARG, and the mask is the causal one the step builds.
COMPILED_TREE_ATTENTION: dict[str, int] = {}


def allow_trees(attention: str, max_nodes: int, compiled: bool = False) -> None:
    """Let runners of models on the attention implementation `attention` verify trees of up to
    `max_nodes` draft tokens (it reads the tree from the TREE_KWARG keyword or the 4D mask);
    `compiled`: in compiled steps too (it reads the paths of tree.path_tensors)."""
    TREE_ATTENTION[attention] = max_nodes
    if compiled:
        COMPILED_TREE_ATTENTION[attention] = max_nodes


def compiled_tree_nodes(model) -> int:
    """The most nodes a compiled tree step of `model` verifies (0: its attention can't)."""
    return COMPILED_TREE_ATTENTION.get(getattr(model.config, "_attn_implementation", None), 0)


@functools.cache
def _cache_keyword_of(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_kwargs(model, cache) -> dict:
    """The forward keyword argument that passes `cache` to `model`.

    transformers renamed it from `past_key_values` to `cache` (5.24 takes both and warns on the
    old name; 5.17, on the GPU machines we are lent, knows only the old one and silently drops
    `cache=` into **kwargs, running every forward without a cache). So ask the model's own
    forward which name it declares.
    """
    return {_cache_keyword_of(type(model)): cache}


class GrowingLayer(DynamicLayer):
    """A DynamicLayer that writes new keys and values into spare room instead of concatenating.

    DynamicLayer's torch.cat copies the layer's whole cache on every forward; at a 729-token
    context that was 4% of a SmolLM2-135M step on CPU. Here the room doubles when full, the
    keys and values handed out are views of the filled part, and a crop is a shorter view.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._key_room = key_states.new_empty(key_states.shape[:-2] + (0, key_states.shape[-1]))
        self._value_room = value_states.new_empty(value_states.shape[:-2] + (0, value_states.shape[-1]))
        self.hold(0)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        self.reserve(key_states.shape[-2])
        self._key_room[..., start:end, :] = key_states
        self._value_room[..., start:end, :] = value_states
        if torch.compiler.is_dynamo_compiling():
            # A compiled step leaves the views to its caller (CompiledRunner calls hold): a view
            # stored here would be one more output of the graph for each layer's keys and values,
            # rebuilt and assigned after every call (0.5 ms of SmolLM2's 10 ms step on two cores).
            # (Not torch.compiler.is_compiling(): that is one flag for the whole process, true in
            # eager steps on this thread while another thread compiles.)
            return self._key_room[..., :end, :], self._value_room[..., :end, :]
        self.hold(end)
        return self.keys, self.values

    def reserve(self, tokens: int) -> None:
        """Room for `tokens` more tokens (a compiled step must not grow the cache itself)."""
        if not self.is_initialized:
            return
        filled = self.get_seq_length()
        # Never filled to the last slot: a compiled step would treat a full room as a case of its own.
        if filled + tokens >= self._key_room.shape[-2]:
            self._key_room = _grown(self._key_room, filled, filled + tokens + 1)
            self._value_room = _grown(self._value_room, filled, filled + tokens + 1)
            self.hold(filled)

    def get_seq_length(self) -> int:
        return self.keys.shape[-2] if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last -tokens_to_remove tokens (transformers 5 passes a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove and self.is_initialized:
            self.hold(max(0, self.get_seq_length() + tokens_to_remove))

    def hold(self, length: int) -> None:
        """Hand out the first `length` tokens written into the room as the layer's keys and values
        (a crop, a growth, and after a compiled step, which leaves this to its caller)."""
        self.keys = self._key_room[..., :length, :]
        self.values = self._value_room[..., :length, :]


def _grown(room: torch.Tensor, filled: int, needed: int) -> torch.Tensor:
    """Room for at least `needed` tokens (twice the old room if that is more), the first
    `filled` copied over."""
    size = max(needed, 2 * room.shape[-2])
    bigger = room.new_empty(room.shape[:-2] + (size, room.shape[-1]))
    bigger[..., :filled, :] = room[..., :filled, :]
    return bigger


def growing_cache(config) -> DynamicCache:
    """A DynamicCache for `config` whose full-attention layers are GrowingLayers (sliding-window
    and other special layers stay as transformers builds them)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    if cache.layer_class_to_replicate is DynamicLayer:  # layers made on first use
        cache.layer_class_to_replicate = GrowingLayer
    return cache


class CachedModel:
    """One model's incremental forward passes over a single sequence (batch size 1)."""

    def __init__(self, model) -> None:
        self.model = model
        self.device = model.device
        self.cache = growing_cache(model.config)

    @property
    def length(self) -> int:
        """How many tokens of the sequence the cache holds."""
        return self.cache.get_seq_length()

    def begin(self) -> None:
        """A new generation starts on this runner (compiled runners choose their path here)."""

    @torch.inference_mode()
    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        """Run the tokens that follow the cached ones; return float32 logits [n, V] ([1, V] if last_only).

        Positions come from the cache length (transformers 5 infers them), so the logits equal
        those of an uncached forward over the whole sequence.
        """
        input_ids = torch.tensor([token_ids], device=self.device)
        out = self.model(
            input_ids=input_ids,
            **cache_kwargs(self.model, self.cache),
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        return out.logits[0].float()

    @property
    def max_tree_nodes(self) -> int:
        """The most draft nodes forward_tree verifies in one step (0: chains only): trees need an
        attention that applies a custom mask, and growing layers to compact (keep_rows)."""
        attention = getattr(self.model.config, "_attn_implementation", None)
        layers = self.cache.layers
        growing = all(type(layer) is GrowingLayer for layer in layers) and (
            bool(layers) or self.cache.layer_class_to_replicate is GrowingLayer)
        return TREE_ATTENTION.get(attention, 0) if growing else 0

    @torch.inference_mode()
    def forward_tree(self, token_ids: list[int], parents: list[int]) -> torch.Tensor:
        """Verify a tree draft in one forward: token_ids = [last, d1..dn], parents[i] the parent
        of draft node i (-1: the last token; see tree.py). Returns float32 logits [n + 1, V],
        row i + 1 scoring what follows node i's path. The cache then holds all n + 1 rows in
        this order; keep_rows keeps the accepted path's."""
        check_parents(parents)
        if len(parents) != len(token_ids) - 1 or len(parents) > self.max_tree_nodes:
            raise ValueError(f"a tree of {len(parents)} nodes (with {len(token_ids)} tokens) can't be verified "
                             f"here: at most {self.max_tree_nodes} nodes, one parent per draft token")
        cached = self.length
        positions = torch.tensor([[cached + depth for depth in row_depths(parents)]], device=self.device)
        mask = tree_attention_mask(parents, cached, self.model.dtype, self.device)
        out = self.model(
            input_ids=torch.tensor([token_ids], device=self.device),
            attention_mask=mask,
            position_ids=positions,
            **cache_kwargs(self.model, self.cache),
            use_cache=True,
            **{TREE_KWARG: parents},
        )
        return out.logits[0].float()

    @torch.inference_mode()
    def keep_rows(self, start: int, rows: list[int]) -> None:
        """After forward_tree from `start` cached tokens: keep the first `start` tokens and the
        step's rows `rows` (offsets from `start`, in path order), moved to follow them; forget
        the rest (the rejected branches)."""
        index = torch.tensor([start + row for row in rows], device=self.device)
        for layer in self.cache.layers:
            if not layer.is_initialized:
                continue
            # index_select copies first, so moving a row onto another kept row's slot is safe
            layer._key_room[..., start : start + len(rows), :] = layer.keys.index_select(-2, index)
            layer._value_room[..., start : start + len(rows), :] = layer.values.index_select(-2, index)
            layer.hold(start + len(rows))

    def memory_bytes(self) -> int:
        """Bytes the cache has allocated (its spare room included)."""
        return cache_memory_bytes(self.cache)

    def crop(self, keep: int) -> None:
        """Forget every cached token after the first `keep`."""
        # transformers 5: crop() takes a negative count to remove; crop(0) is a no-op.
        surplus = self.length - keep
        if surplus > 0:
            self.cache.crop(-surplus)


class EagerPath(DecodePath):
    """A model decoding eagerly on its growing cache: CachedModel runners. Two paths of one
    model are equal, so what is kept per path (a conversation's cache) is kept once."""

    def __init__(self, model) -> None:
        self.model = model
        self.name = model_name(model)

    def __call__(self, model=None) -> CachedModel:
        self._check_model(model)
        return CachedModel(self.model)

    @property
    def decode_path(self) -> str:
        return EAGER_DYNAMIC

    def __eq__(self, other) -> bool:
        return type(other) is EagerPath and other.model is self.model

    def __hash__(self) -> int:
        return id(self.model)


class KeptRunner:
    """One model's runner kept from one generation to the next.

    A chat sends its whole conversation every turn. The keys and values of the turns the
    model has already read are still in this runner's cache, so a new sequence only has to be
    read from where it stops matching what the cache holds (on CPU, SmolLM2-135M reads a
    1500-token conversation in about 2.8 s: that is the time to first token saved per turn).
    """

    def __init__(self, make_runner: Callable[[object], CachedModel], model) -> None:
        self._make_runner, self._model = make_runner, model
        self._runner: CachedModel | None = None
        self._held: list[int] = []  # exactly the tokens the runner's cache holds
        # Generations started on it so far. Engines may share one KeptRunner (one kept
        # conversation per model, whatever the settings): only the latest generation may use it.
        self.generation = 0

    @property
    def model(self):
        return self._model

    def memory_bytes(self) -> int:
        """Bytes its cache has allocated now (0 when it keeps none)."""
        measure = getattr(self._runner, "memory_bytes", None)
        return measure() if measure is not None else 0

    def start(self, sequence: list[int], at_most: int | None = None) -> CachedModel:
        """The runner for a new generation of `sequence` (`generation` counts it), its cache
        cropped as keep_shared does."""
        self.generation += 1
        runner = self.keep_shared(sequence, at_most)
        runner.begin()
        return runner

    def keep_shared(self, sequence: list[int], at_most: int | None = None) -> CachedModel:
        """The runner, its cache cropped to the longest prefix it shares with sequence[:-1]
        (the last token is always left to read: it yields the next token's distribution), and
        to at most `at_most` tokens (a drafter needs the target's features from there on)."""
        if self._runner is None:
            self._runner, self._held = self._make_runner(self._model), []
        shared = shared_prefix_length(self._held, sequence[:-1])
        if at_most is not None:
            shared = min(shared, at_most)
        self._runner.crop(shared)
        self._held = self._held[:shared]
        return self._runner

    def finish(self, sequence: list[int]) -> None:
        """The generation ended cleanly with `sequence`; the cache holds a prefix of it (and
        perhaps tokens that were drafted and kept but not emitted, which are dropped)."""
        if self._runner is not None:
            self._held = sequence[: self._runner.length]
            self._runner.crop(len(self._held))

    def drop(self) -> None:
        """Forget the cache (a forward may have stopped halfway; or to start cold)."""
        self._runner, self._held = None, []


def cache_memory_bytes(cache) -> int:
    """Bytes of the tensors a transformers Cache's layers hold (views of one storage count once)."""
    storages: dict[int, int] = {}
    for layer in getattr(cache, "layers", ()):
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                storage = value.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def shared_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens the two sequences have in common."""
    length = min(len(a), len(b))
    for i in range(length):
        if a[i] != b[i]:
            return i
    return length
