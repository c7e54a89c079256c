"""The fast decode path: a preallocated (static) KV cache and compiled fixed-shape steps.

In eager PyTorch a small model's decoding step costs Python and kernel-launch overhead, not
arithmetic, which makes a draft model nearly as slow per token as its target (issue 6).
Compiling the step with a static cache removes that overhead (CUDA graphs on a GPU), but only
for shapes that never change. So:

- The KV cache is preallocated up to `max_length` tokens (transformers' StaticCache) and never
  moves. Its length is ours: rolling back after rejected drafts just lowers the position. The
  rejected slots keep stale keys and values until the next step overwrites them; the causal
  mask, built from the position, hides every slot at or beyond the current length.
- Steps have fixed shapes: n new tokens run as a step of `bucket` tokens, the smallest of
  `step_sizes` that holds n, padded with PAD_TOKEN. With `dynamic=False` every size is its own
  full compile (tens of seconds each for a 7B model), so the default sizes are a few buckets,
  1, 2, 4, 8 and 9 (k+1 for the longest draft), not one per verify length: a verify over 5-7
  tokens runs padded to 8, which on a memory-bound GPU costs about what 5 would. A padded token
  sits after every real one, so causal attention keeps it out of the real tokens' logits; its
  cache slot lies beyond the length and is overwritten later. Greedy output stays identical.
- Inputs no step size holds (the prompt prefill, mostly) run eagerly on the same cache.
- Every step attends over all `max_length` slots (the mask hides the unfilled ones), so the
  cache is sized to what a chat needs (1024 tokens by default, the model's context at most),
  not to the model's context: on a GPU the attention over unused slots is memory traffic.
- Built with `feature_layers` (an EAGLE head's), each step also returns the inputs of those
  target layers as outputs of its graph (features.StepFeatures: CUDA graphs replay no hooks),
  and the runner hands the real tokens' rows to the model's taps, so the head's engines decode
  on the compiled steps. The steps run an untapped twin of the model for that; eager steps (a
  prompt, a spilled sequence) run the model, whose hooks fill its taps.
- A sequence that outgrows `max_length` moves its cache into a DynamicCache and continues
  eagerly: correct, just not compiled. Once a rollback or a new turn brings the sequence back
  within `max_length` (a retry, a cleared chat), it moves back onto the static cache.

`StaticSteps(model)` owns one model's cache and compiled steps, and compiles (warms up) every
step shape when it is built, so the first reply is not slow. Calling it with the model returns
a `StaticCacheRunner` with CachedModel's interface, so it is the `make_runner` hook of
SpeculativeEngine and ModelDrafter. If compilation fails, it logs one line saying why and
hands out eager CachedModel runners from then on (decode_path says which path is in use).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterable

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from .base import EAGER_DYNAMIC, DecodePath, context_limit, model_name
from .features import StepFeatures, settle_features, start_features, untapped
from .compiling import PAD_TOKEN, allow_a_graph_per_shape, compile_failed, step_buckets
from .eager import MASKED_TREE_ATTENTION, CachedModel, cache_kwargs, cache_memory_bytes
from .tree import check_parents, padded_tree, row_depths, tree_attention_mask

logger = logging.getLogger(__name__)

COMPILED_STATIC = "compiled static cache"
EAGER_STATIC = "eager static cache"

# (1, 2, 4, 8, 9): a 1-token step, and k+1 padded up for the adaptive policy's longest draft
# (policy.MAX_DRAFT_LENGTH = 8; a test keeps the two in step)
DEFAULT_STEP_SIZES = step_buckets(9)
DRAFT_STEP_SIZES = (1, 2)  # a draft feeds 1 token per step, 2 after a fully accepted round
DEFAULT_MAX_LENGTH = 1024  # tokens of the static cache: every step attends over all of them


class StaticSteps(DecodePath):
    """One model's preallocated KV cache and its compiled fixed-shape steps.

    Call it with the model to get a runner for one generation (the make_runner hook). Runners
    that are alive at the same time get separate caches, so two generations never share one;
    normally a single cache is reused for every generation.
    """

    def __init__(
        self,
        model,
        *,
        max_length: int | None = None,
        step_sizes: Iterable[int] = DEFAULT_STEP_SIZES,
        compile: bool = True,
        warmup: bool = True,
        progress: bool = True,
        name: str | None = None,
        backend: str = "inductor",
        feature_layers: tuple[int, ...] = (),
        trees: bool = False,
    ) -> None:
        """max_length: tokens the cache holds (default: DEFAULT_MAX_LENGTH, at most the model's
        context). step_sizes: the fixed step shapes, in tokens. compile: False runs the
        same static-cache steps eagerly (for tests and comparisons). warmup: compile every
        step shape now, with a progress bar (progress=False hides it). backend: torch.compile's
        ("eager" traces the steps without generating code: the CPU self-check uses it).
        feature_layers: target layers whose inputs the steps return too (an EAGLE head's).
        trees: verify tree drafts too, on tree steps of the same sizes (a tree of n nodes runs in
        the step of n + 1 tokens, padded), each its own fixed-shape graph taking the tree's
        positions and its 4D mask over every slot; only on an attention that applies that mask
        (sdpa, eager). Compiled at their first use, not at warm-up; a failure leaves the tree
        steps eager on the same static cache, the chain steps compiled."""
        self.model = model.eval()
        # What the fixed-shape steps run: the model's untapped twin, whose own hooks hand the step
        # function the features it returns (engines' taps are filled from those, see _fixed_step).
        self.stepped = untapped(self.model, feature_layers)
        self._features = StepFeatures(self.stepped, feature_layers)
        self.feature_layers = self._features.layer_ids
        self.device = model.device
        self.name = name or model_name(model)
        self.step_sizes = tuple(sorted(set(int(s) for s in step_sizes)))
        if not self.step_sizes or self.step_sizes[0] < 1:
            raise ValueError(f"step_sizes must be positive token counts, got {self.step_sizes}")
        self.max_length = max_length or _default_max_length(model)
        if self.max_length <= self.step_sizes[-1]:
            raise ValueError(f"max_length {self.max_length} must exceed the largest step size {self.step_sizes[-1]}")
        self.cuda = self.device.type == "cuda"
        self.compiled = bool(compile)
        self.fallback_reason: str | None = None
        self.backend = backend
        self.mode = "reduce-overhead" if self.cuda and backend == "inductor" else None  # CUDA graphs on CUDA
        self.warmup_s = 0.0
        attention = getattr(model.config, "_attn_implementation", None)
        self.max_tree_nodes = self.step_sizes[-1] - 1 if trees and attention in MASKED_TREE_ATTENTION else 0
        self.tree_fallback_reason: str | None = None  # why compiling a tree step failed (then they run eagerly)
        self._slots: list[_Slot] = []
        self._spill_logged = False
        if self.compiled:
            allow_a_graph_per_shape()
        self._slots.append(self._new_slot())  # checks the model and allocates the cache now
        if self.compiled and warmup:
            self.warm_up(progress)

    @property
    def decode_path(self) -> str:
        """Which path new runners take: compiled static cache, eager static or eager dynamic."""
        if self.compiled:
            return COMPILED_STATIC
        return EAGER_DYNAMIC if self.fallback_reason else EAGER_STATIC

    def reads_features(self, layer_ids: tuple[int, ...]) -> bool:
        """Whether runners hand a drafter reading `layer_ids` its features: the fixed-shape
        steps return those of feature_layers (CUDA graphs replay no hooks); where compiling
        failed, runners are eager CachedModels, which run the model's hooks."""
        return self.fallback_reason is not None or set(layer_ids) <= set(self.feature_layers)

    def __call__(self, model=None):
        """A runner for one generation (CachedModel's interface). `model` must be ours."""
        self._check_model(model)
        if self.fallback_reason is not None:
            return CachedModel(self.model)
        runner = StaticCacheRunner(self)
        runner._slot = self._acquire(runner)
        return runner

    def warm_up(self, progress: bool = True) -> None:
        """Compile (and on CUDA, record the graph of) every step shape, with a progress bar."""
        from tqdm.auto import tqdm

        if not self.compiled:
            return
        started = time.perf_counter()
        slot = self._slots[0]
        calls = 3 if self.cuda else 1  # cudagraph trees: warm-up run, recording, first replay
        shapes = tqdm(self.step_sizes, desc=f"compiling {self.name}", unit="shape", disable=not progress, leave=False)
        with torch.no_grad():
            for size in shapes:
                for _ in range(calls):
                    self._fixed_step(slot, [PAD_TOKEN] * size, 0, size)  # stale slots: masked later
                if not self.compiled:  # it failed and fell back (logged once)
                    return
        self.warmup_s = time.perf_counter() - started
        logger.info("compiled %d step shapes of %s in %.1f s", len(self.step_sizes), self.name, self.warmup_s)

    # ------------------------------------------------------------ used by StaticCacheRunner

    def run(self, slot: _Slot, token_ids: list[int], start: int, last_only: bool) -> torch.Tensor:
        """Logits [n, V] (float32) of `token_ids` placed at positions start.. of the slot's cache."""
        n = len(token_ids)
        bucket = next((size for size in self.step_sizes if size >= n), None)
        if bucket is not None and start + bucket <= self.max_length:
            logits = self._fixed_step(slot, token_ids, start, bucket)
            return logits[-1:] if last_only else logits
        return self._eager(slot, token_ids, start, last_only)

    def run_tree(self, slot: _Slot, token_ids: list[int], parents: list[int], start: int) -> torch.Tensor:
        """Logits [n + 1, V] (float32) of a tree's verify step ([last, d1..dn], tree.py) at
        positions from `start`: the smallest step size that holds it, padded with leaves under
        the last token (tree.padded_tree), each row at its depth's position under the tree's
        mask over every slot. Its n + 1 rows then fill the slots from `start`, in order."""
        bucket = next(size for size in self.step_sizes if size > len(parents))
        padded = padded_tree(parents, bucket - 1)
        packed = torch.tensor([start, *token_ids, *[PAD_TOKEN] * (bucket - len(token_ids))], device=self.device)
        positions = torch.tensor([start + depth for depth in row_depths(padded)], device=self.device)
        mask = tree_attention_mask(padded, start, self.stepped.dtype, self.device)
        lowest = torch.finfo(mask.dtype).min
        mask = torch.nn.functional.pad(mask, (0, self.max_length - mask.shape[-1]), value=lowest)  # the slots after
        out = None
        if self.compiled and self.tree_fallback_reason is None:
            try:
                if slot.compiled_tree is None:
                    slot.compiled_tree = torch.compile(slot.tree_step, backend=self.backend, mode=self.mode,
                                                       fullgraph=True, dynamic=False)
                if self.cuda:
                    torch.compiler.cudagraph_mark_step_begin()
                out = slot.compiled_tree(packed, positions, mask)
            except Exception as error:  # the chain steps stay compiled: only trees run eagerly
                self.tree_fallback_reason = compile_failed(logger, f"{self.name}'s tree steps", error)
        logits, features = out if out is not None else slot.tree_step(packed, positions, mask)
        n = len(token_ids)
        given = {layer: hidden[:n].clone() for layer, hidden in self._features.by_layer(features).items()}
        settle_features(self.model, n, given)
        return logits[0, :n].to(torch.float32, copy=True)

    def first_spill(self) -> bool:
        """True the first time a sequence outgrows the cache (so that is logged once)."""
        first, self._spill_logged = not self._spill_logged, True
        return first

    # ------------------------------------------------------------ internals

    def _new_slot(self) -> _Slot:
        cache = StaticCache(config=self.model.config, max_cache_len=self.max_length)
        for layer in cache.layers:
            if not isinstance(layer, StaticLayer) or layer.is_sliding:
                raise ValueError(
                    f"{self.name} has sliding-window or linear-attention layers: the static cache "
                    "can't roll back by position there; use the eager dynamic cache"
                )
        slot = _Slot(self.stepped, cache, self._features)
        with torch.no_grad():
            self._eager(slot, [PAD_TOKEN], 0, True)  # allocates K/V on each layer's device
        if self.compiled:
            try:
                slot.compiled = torch.compile(slot.step, backend=self.backend, mode=self.mode, fullgraph=True,
                                              dynamic=False)
            except Exception as error:  # torch.compile unavailable here
                self._fall_back(error)
        return slot

    def _acquire(self, runner: StaticCacheRunner) -> _Slot:
        for slot in self._slots:
            if slot.owner is None or slot.owner() is None:
                slot.owner = weakref.ref(runner)
                return slot
        slot = self._new_slot()  # another generation still holds the cache: allocate one more
        slot.owner = weakref.ref(runner)
        self._slots.append(slot)
        return slot

    def _fixed_step(self, slot: _Slot, token_ids: list[int], start: int, bucket: int) -> torch.Tensor:
        """The fixed-shape step: [start, ids..., PAD...] (1 + bucket values) -> float32 logits [n, V];
        the real tokens' features (feature_layers) go to the model's taps."""
        n = len(token_ids)
        packed = torch.tensor([start, *token_ids, *[PAD_TOKEN] * (bucket - n)], device=self.device)
        out = None
        if self.compiled and slot.compiled is not None:
            try:
                if self.cuda:
                    torch.compiler.cudagraph_mark_step_begin()
                out = slot.compiled(packed)
            except Exception as error:
                self._fall_back(error)
        logits, features = out if out is not None else slot.step(packed)
        # Copies: CUDA graphs overwrite their output buffers at the next replay.
        given = {layer: hidden[:n].clone() for layer, hidden in self._features.by_layer(features).items()}
        settle_features(self.model, n, given)
        return logits[0, :n].to(torch.float32, copy=True)

    def _eager(self, slot: _Slot, token_ids: list[int], start: int, last_only: bool) -> torch.Tensor:
        """Any number of tokens, uncompiled, on the same static cache (prefill, odd sizes)."""
        slot.set_position(torch.tensor(start, device=self.device))
        out = self.model(
            input_ids=torch.tensor([token_ids], device=self.device),
            **slot.cache_arg,
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        return out.logits[0].float()

    def _fall_back(self, error: BaseException) -> None:
        if not self.compiled:
            return
        self.compiled = False
        self.fallback_reason = compile_failed(logger, self.name, error)


class _Slot:
    """One preallocated cache, its step function (compiled or not) and the runner holding it."""

    def __init__(self, model, cache: StaticCache, features: StepFeatures) -> None:
        self.model = model  # the untapped twin (StaticSteps.stepped)
        self.features = features
        self.cache = cache
        self.cache_arg = cache_kwargs(model, cache)  # looked up here, not inside the compiled step
        self.layers = list(cache.layers)
        self.compiled = None  # the torch.compile'd step, when compiling
        self.compiled_tree = None  # the torch.compile'd tree step, from its first use
        self.owner: weakref.ref | None = None

    def set_position(self, start: torch.Tensor) -> None:
        """Make every layer write its next keys and values at `start` (and mask from there)."""
        for layer in self.layers:
            layer.cumulative_length.copy_(start)

    def step(self, packed: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """packed = [start, token ids...] -> (logits [1, len(packed) - 1, V], the inputs of the
        feature layers [len(packed) - 1, H] each). The compiled function.

        The position travels in the same tensor as the tokens: one host-to-device copy a step,
        and under CUDA graphs the cache's length counters are set inside the graph.
        """
        self.set_position(packed[0])
        out = self.model(input_ids=packed[1:].unsqueeze(0), **self.cache_arg, use_cache=True)
        return out.logits, self.features.take()

    def tree_step(self, packed: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor):
        """step() for a tree: its rows at `positions` under `mask` ([1, 1, rows, slots], additive),
        which transformers hands to the attention unchanged. The compiled tree function."""
        self.set_position(packed[0])
        out = self.model(input_ids=packed[1:].unsqueeze(0), position_ids=positions.unsqueeze(0), attention_mask=mask,
                         **self.cache_arg, use_cache=True)
        return out.logits, self.features.take()


class StaticCacheRunner:
    """One generation's view of a StaticSteps cache: CachedModel's forward / crop / length.

    Made by calling a StaticSteps object; holds its cache until the runner is dropped.
    """

    def __init__(self, steps: StaticSteps) -> None:
        self._steps = steps
        self._slot: _Slot | None = None
        self._length = 0
        self._dynamic: CachedModel | None = None  # after outgrowing the static cache

    @property
    def length(self) -> int:
        """How many tokens of the sequence the cache holds."""
        return self._dynamic.length if self._dynamic is not None else self._length

    def begin(self) -> None:
        """A new generation starts (its steps were compiled at load: nothing to choose)."""

    @property
    def max_tree_nodes(self) -> int:
        """The most draft nodes forward_tree verifies (StaticSteps' `trees`; 0: chains only)."""
        return self._steps.max_tree_nodes

    @torch.no_grad()
    def forward_tree(self, token_ids: list[int], parents: list[int]) -> torch.Tensor:
        """CachedModel.forward_tree on the static cache (StaticSteps.run_tree): the tree's rows
        fill the slots after the cached tokens; keep_rows keeps the accepted path's."""
        check_parents(parents)
        if len(parents) != len(token_ids) - 1 or len(parents) > self.max_tree_nodes:
            raise ValueError(f"a tree of {len(parents)} nodes (with {len(token_ids)} tokens) can't be verified "
                             f"here: at most {self.max_tree_nodes} nodes, one parent per draft token")
        start_features(self._steps.model)
        if self._dynamic is None and self._length + self._steps.step_sizes[-1] > self._steps.max_length:
            self._spill()  # (a padded tree step writes up to the largest step's slots)
        if self._dynamic is not None:
            return self._dynamic.forward_tree(token_ids, parents)
        logits = self._steps.run_tree(self._slot, token_ids, parents, self._length)
        self._length += len(token_ids)
        return logits

    @torch.no_grad()
    def keep_rows(self, start: int, rows: list[int]) -> None:
        """After forward_tree from `start` cached tokens: keep the first `start` and the step's
        rows `rows` (offsets from `start`, in path order), moved to follow them."""
        if self._dynamic is not None:
            self._dynamic.keep_rows(start, rows)
            return
        index = torch.tensor([start + row for row in rows], device=self._steps.device)
        for layer in self._slot.layers:
            # index_select copies first, so moving a row onto another kept row's slot is safe
            layer.keys[:, :, start : start + len(rows)] = layer.keys.index_select(2, index)
            layer.values[:, :, start : start + len(rows)] = layer.values.index_select(2, index)
        self._length = start + len(rows)

    @torch.no_grad()
    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        """Run the tokens that follow the cached ones; return float32 logits [n, V] ([1, V] if last_only)."""
        start_features(self._steps.model)  # taps no engine reads keep one forward's rows, not every step's
        if self._dynamic is None and self._length + len(token_ids) > self._steps.max_length:
            self._spill()
        if self._dynamic is not None:
            return self._dynamic.forward(token_ids, last_only)
        logits = self._steps.run(self._slot, token_ids, self._length, last_only)
        self._length += len(token_ids)
        return logits

    def memory_bytes(self) -> int:
        """Bytes of the cache this runner holds (the static slot, or the dynamic one it spilled to)."""
        if self._dynamic is not None:
            return self._dynamic.memory_bytes()
        return cache_memory_bytes(self._slot.cache) if self._slot is not None else 0

    def crop(self, keep: int) -> None:
        """Forget every cached token after the first `keep`: just move the position back."""
        if self._dynamic is not None:
            self._dynamic.crop(keep)
            if self._dynamic.length < self._steps.max_length - self._steps.step_sizes[-1]:
                self._return_to_static()
        else:
            self._length = max(0, min(self._length, keep))

    def _spill(self) -> None:
        """The sequence outgrew the static cache: copy what it holds into a dynamic one."""
        steps = self._steps
        if steps.first_spill():
            logger.warning(
                "%s: a sequence outgrew the %d-token static cache; it continues eagerly", steps.name, steps.max_length
            )
        dynamic = CachedModel(steps.model)
        if self._length:
            for index, layer in enumerate(self._slot.layers):
                keys = layer.keys[:, :, : self._length].clone()
                values = layer.values[:, :, : self._length].clone()
                dynamic.cache.update(keys, values, index)
        self._dynamic = dynamic
        self._slot.owner = None  # the static cache is free for the next generation
        self._slot = None

    def _return_to_static(self) -> None:
        """The sequence fits the static cache again (with room for a full step): copy it back."""
        dynamic, self._dynamic = self._dynamic, None
        self._slot = self._steps._acquire(self)
        self._length = dynamic.length
        for index, layer in enumerate(self._slot.layers):
            dynamic_layer = dynamic.cache.layers[index]
            layer.keys[:, :, : self._length].copy_(dynamic_layer.keys[:, :, : self._length])
            layer.values[:, :, : self._length].copy_(dynamic_layer.values[:, :, : self._length])


def _default_max_length(model) -> int:
    return min(context_limit(model), DEFAULT_MAX_LENGTH)
