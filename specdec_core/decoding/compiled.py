"""The compiled decode path on CPU: steps compiled with inductor's C++ wrapper, any context length.

On CPU a 4-bit step of a small model is bound by memory and by the framework's own work between
kernels: for SmolLM2-135M on two cores, about 5,000 operator calls, 5 of its 12 ms. Compiling the
step with inductor's C++ wrapper (`cpp_wrapper`) removes most of that work. The static cache of
the GPU path (decoding/static.py) does not pay here: every step attends over all of its slots, and on
CPU that costs what compiling saves (1024 slots: 16.5 ms compiled, 16.6 eager). So here the cache
is the eager path's growing cache (runner.GrowingLayer) and the step is compiled with dynamic
shapes: the context length is a symbol, and one graph per step size serves every length.

- Step sizes are buckets (1, 2, 4, 8): n tokens run padded to the smallest that holds them, up to
  MAX_STEP_TOKENS tokens in pieces of the largest. Padded tokens come after the real ones
  (causal attention keeps them out of the real rows) and their cache entries are cropped after.
- Row-exact attention (row_attention) keeps each row of a step bitwise what a 1-token step at its
  position gives, compiled as eager, so speculative output stays token-for-token plain decoding's
  (tested). That is also why a verify step too long for one bucket runs in pieces, not eagerly,
  and why the first MIN_CONTEXT positions of a sequence always run eagerly, one token at a time:
  inductor specialises a dimension of size 0 or 1, so a compiled graph needs some context.
- More than MAX_STEP_TOKENS tokens (a prompt) are read eagerly on the same cache, as every method reads
  them.
- Tree drafts (decoding/tree.py) run on tree steps, one graph per node count (`tree_sizes`; the
  loader's CPU_TREE_SIZES): a tree of n nodes runs padded to the smallest that holds it (extra
  leaves under the last token, after the real rows). The graph takes the rows' positions and each
  row's path (its ancestors' rows and its own, tree.path_tensors) as inputs, so one graph serves
  every shape of its size; row-exact attention attends each row to the cached keys and its path's,
  so every row is bitwise its path's compiled 1-token step. They compile after the chain steps
  (never delaying them), each path size a symbol of its own (no duck shaping), and only on an
  attention that reads them (eager.compiled_tree_nodes). keep_rows compacts the growing cache.
- The steps run an untapped twin of the model (features.py), so compiling them (on this thread
  or another) never writes into a tap that engines read. Built with `feature_layers` (an EAGLE
  head's), the step returns those layers' inputs as outputs of its graph beside the logits
  (features.StepFeatures), and the runner settles each piece's rows into the model's taps,
  padding left out: the head's engines keep the compiled target, in the background too. Eager
  steps (the prompt, the first MIN_CONTEXT tokens, a generation begun before the compile
  ended) run the model itself, whose hooks fill its taps.
- Each step size is compiled ahead of its first call (dynamo's aot_compile: the whole step one
  graph, no guards) into a function this CompiledSteps keeps and calls only with a step of that
  size on its own model's cache: no other model is ever handed its graphs, and no guard is
  checked before a call (checking dynamo's took a tenth of a 1-token step).
- Compiling takes minutes on two cores the first time (docs/decode-paths.md). With a cache folder
  (step_cache.py; the app's cache, for the presets) each compiled step is saved there, and a
  later start loads it in seconds instead of tracing and compiling again. `compile: auto`
  compiles them in the background (`background=True`, for a 4-bit target): runners step
  eagerly meanwhile, and each takes the compiled steps at the first generation it begins once
  they are ready. With a `helper` (the loader's), a helper process compiles and saves them,
  stopped while runners decode (helper_process.py: a compile in this process halved the
  replies' speed), and a thread here loads them. Without one the thread compiles them itself,
  giving way to decoding: its tracing is Python and would hold the GIL against every step
  (_give_way). And
  torch.compiler.is_compiling() is one flag for the process, true in every thread while one
  compiles, so the cache asks torch.compiler.is_dynamo_compiling() instead.

`CompiledSteps(model)` compiles (warms up) every bucket when it is built; calling it returns a
CompiledRunner, CachedModel with compiled steps, so it is the `make_runner` hook of
SpeculativeEngine and ModelDrafter. If compiling fails it logs one line and hands out eager
CachedModel runners from then on (decode_path says which path is in use).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref

import torch

from .features import StepFeatures, settle_features, start_features, untapped
from .base import EAGER_DYNAMIC, MAX_STEP_TOKENS, DecodePath, model_name
from .compiling import PAD_TOKEN, allow_a_graph_per_shape, compile_failed
from .eager import CachedModel, GrowingLayer, cache_kwargs, compiled_tree_nodes
from .helper_process import HelperCommand, HelperProcess
from .step_cache import StepCache
from .tree import TREE_KWARG, check_parents, padded_tree, path_tensors, row_depths

logger = logging.getLogger(__name__)

COMPILED_DYNAMIC = "compiled steps (C++ wrapper), dynamic cache"
COMPILING = "eager dynamic cache, compiling its steps in the background"
# A background compile waits until runners have not decoded for this long (seconds): longer
# than the pauses between the rounds of one reply.
_QUIET_S = 0.3
CPU_STEP_SIZES = (1, 2, 4, 8)  # torch's int4 kernel works in blocks of 4 rows: 3 runs as 4
# The node counts of the tree steps the loader compiles: the tree-size policy's budgets
# (policy/tree_size.py LADDER) up to what row-exact attention verifies in one step (16 nodes).
CPU_TREE_SIZES = (4, 8, 16)
MIN_CONTEXT = 2  # cached tokens a compiled step needs (sizes 0 and 1 would be specialised)
# Tokens cached while compiling. Any length >= MIN_CONTEXT then serves every length, as long as
# no two sizes of the traced step are equal: dynamo gives equal sizes one symbol and would compile
# again whenever they differ (so not 8, a bucket; 37 and the room it grows to, 76, match nothing).
_WARMUP_CONTEXT = 37
# The C++ wrapper, its entry function built apart from the kernels (at -O1 instead of -O3): for
# SmolLM2's steps on two cores that compiles in a third of the time (136 s against 403 for two
# step sizes, cold), and the steps ran as fast (9.2-9.3 against 9.5-10.3 ms a 1-token step).
_INDUCTOR_OPTIONS = {"cpp_wrapper": True, "cpp_wrapper_build_separate": True}


def _no_guards(entries) -> list[bool]:
    """Dynamo's guard filter that keeps none. Before each call a compiled function checks its
    guards: by default thousands on the model's modules (their hooks, attributes, the type and
    shape of each of their 270 tensors); on SmolLM2's 1-token step on two cores that took 1.5 ms
    of 12. Each compiled step here belongs to one model, prepared before compiling (4-bit layers,
    row-exact attention, the twin's feature hooks) and not changed after, and is called only by
    its runner, with its own size, at MIN_CONTEXT cached tokens or more (where the context length
    is a symbol): what the guards would check. Keeping none also lets a step be saved: dynamo
    can't save guards on a model's closures and objects."""
    return [False] * len(entries)


def _unguarded(step):
    """A compiled step that skips its (empty) guard check: binding its arguments for it costs
    Python time at every call."""
    disable = getattr(step, "disable_guard_check", None)
    if disable is not None:
        disable()
    return step


class _Stepper:
    """What a compiled step reads besides its input and cache: the untapped twin, the features
    it returns, the cache's keyword. A plain object (not CompiledSteps, with its thread and locks)
    so that dynamo can save the compiled step."""

    def __init__(self, model, features: StepFeatures, cache_keyword: str) -> None:
        self.model, self.features, self.cache_keyword = model, features, cache_keyword


def _step(stepper: _Stepper, input_ids: torch.Tensor, cache) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The compiled function: logits [1, n, V] of input_ids after the cached tokens, and the
    inputs of the feature layers in that call (outputs of the graph, not writes into a tap)."""
    logits = stepper.model(input_ids=input_ids, **{stepper.cache_keyword: cache}, use_cache=True).logits
    return logits, stepper.features.take()


def _tree_step(stepper: _Stepper, input_ids: torch.Tensor, position_ids: torch.Tensor, paths: tuple, cache):
    """The compiled function of a tree's verify step (decoding/tree.py): _step's outputs for
    input_ids = [last, d1..dn] at their depths' positions, each row attending to the cached
    tokens and its path (`paths`, tree.path_tensors; row-exact attention reads them)."""
    logits = stepper.model(input_ids=input_ids, position_ids=position_ids, **{stepper.cache_keyword: cache},
                           use_cache=True, **{TREE_KWARG: paths}).logits
    return logits, stepper.features.take()


class CompiledSteps(DecodePath):
    """One model's compiled steps (a graph per bucket); calling it gives a runner per generation."""

    def __init__(self, model, *, step_sizes=CPU_STEP_SIZES, feature_layers: tuple[int, ...] = (),
                 warmup: bool = True, progress: bool = True, name: str | None = None,
                 background: bool = False, cache_dir=None, tree_sizes: tuple[int, ...] = (),
                 helper: HelperCommand | None = None) -> None:
        self.model = model.eval()
        self.name = name or model_name(model)
        # What the compiled steps run: the model's untapped twin, so no compile (on whatever thread)
        # writes into the taps engines read; its own hooks hand the step the features it returns.
        self.stepped = untapped(self.model, feature_layers)
        self._features = StepFeatures(self.stepped, feature_layers)
        self.feature_layers = self._features.layer_ids
        self.step_sizes = tuple(sorted(set(int(s) for s in step_sizes)))
        if not self.step_sizes or self.step_sizes[0] != 1:
            raise ValueError(f"step_sizes must include 1, got {self.step_sizes}")
        self.compiled = True
        self.fallback_reason: str | None = None
        self.warmup_s = 0.0
        self._graphs: dict = {}  # step size -> its compiled function, filled by warm_up
        # Tree steps (node counts; none by default): compiled after the chain steps, so trees
        # never delay them; a runner verifies trees of up to the largest one ready when it begins.
        # Only on an attention that reads a compiled step's tree (row-exact attention), within
        # the nodes it takes: another would apply the step's causal mask to every row.
        sizes = sorted(set(int(n) for n in tree_sizes))
        if sizes and sizes[0] < 1:
            raise ValueError(f"tree_sizes must be node counts of 1 or more, got {tuple(sizes)}")
        self.tree_sizes = tuple(n for n in sizes if n <= compiled_tree_nodes(self.stepped))
        self._tree_graphs: dict = {}  # node count -> its compiled tree step, in increasing order
        self.trees_warmup_s = 0.0
        self.loaded = 0  # how many of them came from the cache folder
        # Set once runners may take the compiled steps: at once, or when the background compile is done.
        self.ready = threading.Event()
        self._closed = False
        self._compiling: threading.Thread | None = None
        self._last_decoded = 0.0  # time.monotonic() of a runner's latest step
        # A background compile with a cache folder may run in a helper process (helper_process.py),
        # started by the background thread; this one then loads the steps it saves.
        self._helper_command = helper if background and cache_dir else None
        self._helper: HelperProcess | None = None
        (cache_keyword,) = cache_kwargs(model, None)  # looked up here, not inside the compiled step
        self._stepper = _Stepper(self.stepped, self._features, cache_keyword)
        allow_a_graph_per_shape()
        self._cache = StepCache(cache_dir, model, self.feature_layers, _INDUCTOR_OPTIONS) if cache_dir else None
        try:
            self._compiler, self._tree_compiler = (
                torch.compile(step, dynamic=True, fullgraph=True,
                              options={**_INDUCTOR_OPTIONS, "guard_filter_fn": _no_guards})  # (torch.compile takes the filter out)
                for step in (_step, _tree_step))
        except Exception as error:  # torch.compile unavailable here
            self._fall_back(error)
        if background:
            self._compiling = threading.Thread(target=self._compile_in_background, name=f"compiling {self.name}",
                                               daemon=True)
            self._compiling.start()
            _COMPILING.add(self)
            return
        self.ready.set()
        if warmup:
            self.warm_up(progress)

    @property
    def decode_path(self) -> str:
        if self.compiled and self.ready.is_set():
            return COMPILED_DYNAMIC
        return COMPILING if self.compiled and self.compiling else EAGER_DYNAMIC

    @property
    def compiling(self) -> bool:
        """Whether a background compile is still running."""
        return self._compiling is not None and self._compiling.is_alive()

    def reads_features(self, layer_ids: tuple[int, ...]) -> bool:
        """Whether these steps hand a drafter reading `layer_ids` its features: the compiled
        steps return those of feature_layers; eager ones (compiling failed) run the model's hooks."""
        return not self.compiled or set(layer_ids) <= set(self.feature_layers)

    def __call__(self, model=None) -> CachedModel:
        self._check_model(model)
        return CompiledRunner(self) if self.compiled else CachedModel(self.model)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background compile to end (at most `timeout` seconds); whether the compiled
        steps are ready then. False at once for steps that failed to compile or were closed."""
        if self._compiling is not None:
            self._compiling.join(timeout)
        return self.compiled and self.ready.is_set()

    def close(self) -> None:
        """No more compiling: a background compile stops at its next Python call, a helper at once."""
        self._closed = True
        helper = self._helper
        if helper is not None:
            helper.stop()

    def decoding(self) -> None:
        """A runner of these steps is decoding now: a background compile gives way (_give_way),
        a helper process is stopped meanwhile."""
        self._last_decoded = time.monotonic()
        helper = self._helper  # (None again once it has ended: no lock on every step after)
        if helper is not None:
            helper.decoding()

    def _compile_in_background(self) -> None:
        """The background thread: every bucket compiled (by the helper, then loaded here; or here,
        giving way to decoding), then the steps are ready for the runners' next generation; then
        the tree steps likewise. Whatever fails here ends the thread with
        the steps marked eager and one log line (fallback_reason): an exception escaping the
        thread would leave them 'compiled' but never ready, eager without a word."""
        try:
            _lower_this_threads_priority()
            allow_a_graph_per_shape()  # dynamo's config is per thread (torch >= 2.12)
            self._await_helper(lambda: self._saved("step", self.step_sizes))
            sys.settrace(self._give_way)  # this thread's Python calls only
            self.warm_up(progress=False, trees=False)  # (what a helper saved loads; the rest compiles here)
            if self.compiled and not self._closed:
                self.ready.set()  # the chain steps: runners take them now, trees follow
                sys.settrace(None)
                self._await_helper(lambda: self._saved("tree", self.tree_sizes))
                sys.settrace(self._give_way)
                self.warm_up_trees()
        except Exception as error:
            self._fall_back(error)
        finally:
            sys.settrace(None)
            helper, self._helper = self._helper, None
            if helper is not None:
                helper.stop()

    def _await_helper(self, done) -> None:
        """With a helper command: start the helper (once, unless done() already) and let it
        compile until done() or until it ends. One that fails leaves one log line, and the steps it
        didn't save compile here."""
        if self._helper_command is None or self._closed or done():  # (a warm start starts none)
            return
        if self._helper is None:
            try:
                self._helper = HelperProcess(self._helper_command, _QUIET_S)
            except OSError as error:  # no process, or no log file (an unwritable cache folder)
                logger.warning("the compile helper of %s could not start (%s): compiling in this process",
                               self.name, error)
                self._helper_command = None
                return
        code = self._helper.wait(lambda: done() or self._closed)
        if code:
            logger.warning("the compile helper of %s failed (%s): compiling in this process",
                           self.name, self._helper.failure(code))
        if code is not None:
            self._helper_command = None  # ended: nothing more to wait for

    def _saved(self, kind: str, sizes: tuple[int, ...]) -> bool:
        """Whether the cache folder holds a saved step of every size in `sizes`."""
        return all(self._cache.path(size, kind).is_file() for size in sizes)

    def _give_way(self, frame, event, arg) -> None:
        """The compiling thread's trace function, called at each Python call it makes: it waits
        while a runner decodes. Tracing is Python, and holds the GIL: each time a decoding step
        let go of it (in every kernel) the step waited, and replies crawled (SmolLM2 4-bit, two
        cores: 0.2-2 tok/s against 45 while it traced). The compiler's own processes (C++) go on
        meanwhile, at a lower priority."""
        while time.monotonic() - self._last_decoded < _QUIET_S and not self._closed:
            time.sleep(_QUIET_S / 4)
        if self._closed and _may_stop_in(frame):
            raise _Closed

    @property
    def shapes_ready(self) -> int:
        """How many step sizes are compiled (or loaded) so far, or saved by a helper."""
        if self._helper is not None and self._cache is not None:
            return max(len(self._graphs), sum(self._cache.path(size).is_file() for size in self.step_sizes))
        return len(self._graphs)

    @property
    def tree_nodes_ready(self) -> int:
        """The most nodes a compiled tree step verifies now (0: none ready). Trees compile in
        increasing size, so every smaller size is ready too."""
        return max(self._tree_graphs, default=0)

    def warm_up(self, progress: bool = True, trees: bool = True) -> None:
        """Compile (or load) every bucket now, with a progress bar, and run each once on a
        throwaway cache; then the tree steps (unless `trees` is False)."""
        from tqdm.auto import tqdm

        if not self.compiled:
            return
        started = time.perf_counter()
        runner = CompiledRunner(self, warming_up=True)
        with torch.inference_mode():
            runner.forward([PAD_TOKEN] * _WARMUP_CONTEXT)
            sizes = tqdm(self.step_sizes, desc=f"compiling {self.name}", unit="shape", disable=not progress,
                         leave=False)
            for size in sizes:
                if not self.compiled or self._closed:
                    return
                runner.forward([PAD_TOKEN] * size)
                runner.crop(_WARMUP_CONTEXT)
        self.warmup_s = time.perf_counter() - started
        how = f"loaded {self.loaded} from {self._cache.folder}" if self.loaded else "compiled"
        logger.info("%d step shapes of %s in %.1f s (%s)", len(self.step_sizes), self.name, self.warmup_s, how)
        if trees:
            self.warm_up_trees()

    def warm_up_trees(self) -> None:
        """Compile (or load) the tree step of every size in tree_sizes, smallest first, each run
        once on a throwaway cache (a chain written as a tree: any shape traces the same graph)."""
        if not self.compiled or not self.tree_sizes:
            return
        started = time.perf_counter()
        runner = CompiledRunner(self, warming_up=True)
        with torch.inference_mode():
            runner.forward([PAD_TOKEN] * _WARMUP_CONTEXT)
            for nodes in self.tree_sizes:
                if not self.compiled or self._closed:
                    return
                if self.run_tree(runner, [PAD_TOKEN] * (nodes + 1), list(range(-1, nodes - 1)), compile=True) is None:
                    return
                runner.crop(_WARMUP_CONTEXT)
        self.trees_warmup_s = time.perf_counter() - started
        logger.info("%d tree step shapes of %s in %.1f s", len(self.tree_sizes), self.name, self.trees_warmup_s)

    def _load_or_compile(self, size: int, runner: CompiledRunner, tree_inputs: tuple | None = None):
        """The compiled function of steps of `size` tokens (a tree step's of `size` nodes, traced
        on `tree_inputs`), at its first call: from the cache folder, or compiled on `runner`'s
        cache (room reserved) and saved there."""
        compiler = self._compiler if tree_inputs is None else self._tree_compiler
        aot_compile = getattr(compiler, "aot_compile", None)
        if aot_compile is None:  # torch.compile replaced by a plain wrapper (the tests' stand-in)
            return compiler
        if tree_inputs is None:
            inputs = (torch.full((1, size), PAD_TOKEN),)
        else:
            inputs = tree_inputs
        if self._cache is None:
            return _unguarded(self._compile(aot_compile, inputs, runner, tree=tree_inputs is not None))
        kind = "step" if tree_inputs is None else "tree"
        with self._cache.inductor_folder():
            step = self._cache.load(size, kind)
            if step is not None:
                self.loaded += 1
                return _unguarded(step)
            step = self._compile(aot_compile, inputs, runner, tree=tree_inputs is not None)
            self._cache.save(size, step, kind)
            return _unguarded(step)

    def _compile(self, aot_compile, inputs: tuple, runner: CompiledRunner, tree: bool = False):
        """The step on `inputs` (before the cache) compiled ahead of its call (aot_compile), on
        runner's cache."""
        # A float the step reads (an epsilon, a scale) would otherwise be traced as a symbol, and
        # the trace then restarted with it a constant: every step traced twice.
        # A tree step's path sizes must each stay a symbol of its own: duck shaping would give
        # sizes equal while tracing (two paths, a path and the key-value heads) one symbol, and the
        # graph, called with no guards, would then compute other trees wrong.
        with torch._dynamo.config.patch(specialize_float=True), \
                torch.fx.experimental._config.patch(use_duck_shape=not tree):
            return aot_compile(((self._stepper, *inputs, runner.cache), {}))

    def bucket(self, tokens: int) -> int:
        """The step size that runs `tokens` tokens (the largest one for more)."""
        return next((size for size in self.step_sizes if size >= tokens), self.step_sizes[-1])

    def run(self, runner: CompiledRunner, token_ids: list[int]) -> tuple[torch.Tensor, dict] | None:
        """One padded compiled step: logits [n, V] and the inputs of feature_layers by layer
        ([size, H] each, padding included), or None if compiling failed (now or before)."""
        if not self.compiled:
            return None
        size = self.bucket(len(token_ids))
        runner.reserve(size)
        padded = torch.tensor([token_ids + [PAD_TOKEN] * (size - len(token_ids))])
        try:
            graph = self._graphs.get(size) or self._graphs.setdefault(size, self._load_or_compile(size, runner))
            logits, features = graph(self._stepper, padded, runner.cache)
        except Exception as error:
            self._fall_back(error)
            return None
        return logits[0, : len(token_ids)], self._features.by_layer(features)

    def run_tree(self, runner: CompiledRunner, token_ids: list[int], parents: list[int],
                 compile: bool = False) -> tuple[torch.Tensor, dict] | None:
        """One compiled tree step ([last, d1..dn] with their parents, tree.py) on the tree step of
        the smallest node count that holds it, padded (padded_tree): logits [n + 1, V] and the
        features as run() gives them; None if compiling failed. Compiles a size not ready only
        when told to (the warm-up): a runner only uses sizes ready when it began."""
        if not self.compiled:
            return None
        nodes = next(size for size in self.tree_sizes if size >= len(parents))
        padded = padded_tree(parents, nodes)
        length = runner.length
        runner.reserve(nodes + 1)
        input_ids = torch.tensor([token_ids + [PAD_TOKEN] * (nodes + 1 - len(token_ids))])
        positions = torch.tensor([[length + depth for depth in row_depths(padded)]])
        paths = path_tensors(padded)
        try:
            graph = self._tree_graphs.get(nodes)
            if graph is None and compile:
                graph = self._tree_graphs[nodes] = self._load_or_compile(nodes, runner, (input_ids, positions, paths))
            logits, features = graph(self._stepper, input_ids, positions, paths, runner.cache)
        except Exception as error:
            self._fall_back(error)
            return None
        return logits[0, : len(token_ids)], self._features.by_layer(features)

    def _fall_back(self, error: BaseException) -> None:
        if self.compiled:
            self.compiled = False
            if not self._closed:  # (closing stops a background compile with an error: not a failure)
                self.fallback_reason = compile_failed(logger, self.name, error)


# Where a closed compile must not stop: raised as such a function is called, _Closed would skip
# its body, and a lock it exists to release (logging's Handler.release, a Python context
# manager's __exit__) would stay held for good: the process then hung in logging at exit.
_CLEANUP_MODULES = ("logging", "threading", "contextlib", "queue", "concurrent", "weakref", "_weakrefset")
_CLEANUP_FUNCTIONS = ("__exit__", "__aexit__", "release", "_releaseLock", "close", "flush", "__del__")


def _may_stop_in(frame) -> bool:
    """Whether a closed background compile may stop as `frame`'s function is called (else it
    stops at a later call)."""
    module = frame.f_globals.get("__name__", "").split(".")[0]
    return module not in _CLEANUP_MODULES and frame.f_code.co_name not in _CLEANUP_FUNCTIONS


class _Closed(Exception):
    """Raised on the compiling thread to end a background compile (CompiledSteps.close)."""


_COMPILING: weakref.WeakSet[CompiledSteps] = weakref.WeakSet()  # steps with a background compile
_EXIT_WAIT_S = 10.0


@atexit.register
def _end_background_compiles() -> None:
    """At exit, end the background compiles before Python stops their daemon threads: one
    stopped inside torch's C++ aborts the process ("terminate called without an active exception")."""
    for steps in list(_COMPILING):
        steps.close()
        steps.wait(_EXIT_WAIT_S)


def _lower_this_threads_priority() -> None:
    """Nice this thread (and the compiler processes it starts) below the decoding it runs beside.
    Linux gives each thread its own nice value; elsewhere this does nothing."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


class CompiledRunner(CachedModel):
    """CachedModel whose steps of up to MAX_STEP_TOKENS tokens run on CompiledSteps' graphs, from the
    first generation that begins (begin()) once they are ready."""

    def __init__(self, steps: CompiledSteps, warming_up: bool = False) -> None:
        # Eager steps run the model, whose hooks fill the taps engines read; the warm-up (on a
        # compiling thread, perhaps) runs the twin, which writes none of them.
        super().__init__(steps.stepped if warming_up else steps.model)
        self._steps = steps
        self._compiled = warming_up or steps.ready.is_set()  # the warm-up: compiled at once
        self._warming_up = warming_up  # the compile's own runner: it must not make the compile give way
        self._tree_nodes = steps.tree_nodes_ready

    def begin(self) -> None:
        """A new generation takes the compiled steps if they are ready now, and the compiled tree
        steps ready now: a background compile never switches the path in the middle of a reply
        (compiled and eager steps may round a tie apart)."""
        self._compiled = self._steps.ready.is_set()
        self._tree_nodes = self._steps.tree_nodes_ready
        self._decoding()

    def _decoding(self) -> None:
        """Every step of a reply says so, compiled ones too: the tree steps compile after the
        chain steps are ready, and that compile gives way to replies on them as well."""
        if not self._warming_up:
            self._steps.decoding()

    @property
    def max_tree_nodes(self) -> int:
        """The most draft nodes a tree verify step takes: on compiled steps, the largest compiled
        tree step's ready when the generation began (0: chains only, as a plain compiled reply
        would round an eager tree step's rows apart); on eager steps, the eager path's."""
        return self._tree_nodes if self._compiled else super().max_tree_nodes

    @torch.inference_mode()
    def forward_tree(self, token_ids: list[int], parents: list[int]) -> torch.Tensor:
        """CachedModel.forward_tree on the compiled tree steps, each row bitwise its path's
        compiled 1-token step. Eager where plain decoding is too: eager generations, and a
        context shorter than MIN_CONTEXT (only a prompt of one or two tokens has one)."""
        self._decoding()
        if not self._compiled or self.length < MIN_CONTEXT:
            return super().forward_tree(token_ids, parents)
        check_parents(parents)
        if len(parents) != len(token_ids) - 1 or len(parents) > self.max_tree_nodes:
            raise ValueError(f"a tree of {len(parents)} nodes (with {len(token_ids)} tokens) can't be verified "
                             f"here: at most {self.max_tree_nodes} nodes, one parent per draft token")
        length = self.length
        start_features(self.model)
        compiled = self._steps.run_tree(self, token_ids, parents)
        if compiled is None:  # compiling failed: this step and later ones run eagerly
            self._compiled = False
            return super().forward_tree(token_ids, parents)
        logits, features = compiled
        self._hold(length + len(token_ids))  # the tree's keys and values, not the padding's
        settle_features(self.model, len(token_ids), features)
        return logits.float()

    @torch.inference_mode()
    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        self._decoding()
        if not token_ids or len(token_ids) > MAX_STEP_TOKENS:  # a prompt: read eagerly, as every method reads it
            return super().forward(token_ids, last_only)
        start_features(self.model)  # the pieces settle their rows into the taps: one forward's worth
        rows = [self._step(piece) for piece in self._pieces(token_ids)]
        logits = rows[0] if len(rows) == 1 else torch.cat(rows)
        return logits[-1:] if last_only else logits

    def _pieces(self, token_ids: list[int]):
        """The steps that read token_ids: single tokens while the cache holds fewer than
        MIN_CONTEXT (read eagerly), then pieces of the largest step size. Lazy: each piece is
        cut after the one before it has been read."""
        while token_ids:
            size = 1 if self.length < MIN_CONTEXT else self._steps.step_sizes[-1]
            yield token_ids[:size]
            token_ids = token_ids[size:]

    def _step(self, piece: list[int]) -> torch.Tensor:
        """Float32 logits [n, V] of one piece: compiled where it can be, else eagerly."""
        length = self.length
        compiled = self._steps.run(self, piece) if self._compiled and length >= MIN_CONTEXT else None
        if compiled is None:  # no context yet, or compiling failed (then this and later steps run eagerly)
            logits, features = super().forward(piece), None  # (the model's hooks fill its taps)
        else:
            logits, features = compiled
            self._hold(length + len(piece))  # the piece's keys and values, not the padding's
        settle_features(self.model, len(piece), features)  # this piece's tokens' features, not the padding's
        return logits.float()

    def reserve(self, tokens: int) -> None:
        """Room in every layer for `tokens` more, so the compiled step never grows the cache."""
        for layer in self.cache.layers:
            if isinstance(layer, GrowingLayer):
                layer.reserve(tokens)

    def _hold(self, length: int) -> None:
        """After a compiled step: every layer holds the first `length` tokens (growing layers
        leave their views to this; others keep what they wrote, the padding cropped)."""
        for layer in self.cache.layers:
            if isinstance(layer, GrowingLayer):
                layer.hold(length)
            elif layer.get_seq_length() > length:
                layer.crop(length - layer.get_seq_length())
