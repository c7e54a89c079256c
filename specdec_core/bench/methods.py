"""The decoding methods the benchmark compares, timed alike and traced alike.

ours-*  SpeculativeEngine with drafter none / model / prompt_lookup / eagle / hybrid / medusa /
        layer_skip / retrieval (the preset's draft length and adaptivity; layer_skip calibrates its layers as
        it is made); ours-eagle verifies chains only, ours-eagle-tree the EAGLE head's dynamic
        trees sized by the policy, ours-medusa the Medusa heads' candidate trees sized alike (on the
        baseline's target path, compiled tree steps included where the target has them).
hf-*    Hugging Face `generate()`: plain greedy, assisted generation with the preset's draft as
        `assistant_model`, and prompt lookup (`prompt_lookup_num_tokens=10`).
llamacpp  llama.cpp (llama-cpp-python) decoding the preset's GGUF file plainly and greedily: the
        same prompt token ids (our chat template), eos ids and max_new_tokens. Optional: only
        where llama_cpp is importable (`pip install llama-cpp-python` compiles llama.cpp).
vllm-*  vLLM serving the preset's target: `vllm` plainly, `vllm-ngram` with its n-gram drafting,
        `vllm-eagle` with the preset's EAGLE-3 head. Each is an OpenAI-compatible server asked
        for the question as a chat (its chat template makes the prompt), streamed; its
        speculative counters come from its /metrics (served.py). Optional: only where a server is
        given (--vllm-servers) or vLLM is importable by --vllm-python, which the bench then
        starts (vllm_server.py).

All methods run the same loaded model, so on CPU Hugging Face's too runs on the prepacked linear
layers (packed_linear): the methods differ only in how they decode.

Every method is timed with the same wall clock around one whole generation. What each target
forward did (how many tokens were drafted, how many kept) is read from the engine's own count
for our methods (Stats.rounds: a hook put on the model after compiling doesn't fire inside compiled
steps), and for Hugging Face's
from a forward pre-hook on the target that records the cache length and the number of input
tokens of every call, which `rounds_from_trace` turns into (drafted, accepted) per round.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from ..chat import eos_token_ids
from ..sampling import SamplingParams
from .runs import Run
from .served import ServedMethod
from .vllm_server import VLLM_EAGLE, VLLM_METHODS, server_problem, start_servers, vllm_problem

OURS_BASELINE, OURS_MODEL, OURS_LOOKUP = "ours-baseline", "ours-model", "ours-lookup"
OURS_EAGLE, OURS_HYBRID, OURS_EAGLE_TREE = "ours-eagle", "ours-hybrid", "ours-eagle-tree"
OURS_MEDUSA = "ours-medusa"
OURS_LAYER_SKIP = "ours-layer-skip"
OURS_RETRIEVAL = "ours-retrieval"
HF_GENERATE, HF_ASSISTED, HF_LOOKUP = "hf-generate", "hf-assisted", "hf-lookup"
LLAMACPP = "llamacpp"
METHODS = (OURS_BASELINE, OURS_MODEL, OURS_LOOKUP, OURS_EAGLE, OURS_HYBRID, OURS_EAGLE_TREE, OURS_MEDUSA, OURS_LAYER_SKIP, OURS_RETRIEVAL, HF_GENERATE, HF_ASSISTED, HF_LOOKUP, LLAMACPP, *VLLM_METHODS)
NEEDS_EAGLE_HEAD = (OURS_EAGLE, OURS_HYBRID, OURS_EAGLE_TREE, VLLM_EAGLE)  # left out of the default methods when the preset has none
NEEDS_MEDUSA_HEADS = (OURS_MEDUSA,)  # likewise for Medusa heads
NEEDS_RETRIEVAL = (OURS_RETRIEVAL,)  # and for a retrieval datastore
LLAMACPP_INSTALL = "pip install llama-cpp-python (it compiles llama.cpp: a C++ compiler and cmake, a few minutes)"
BASELINE_OF = {  # each speculative method's own plain decoding
    OURS_MODEL: OURS_BASELINE, OURS_LOOKUP: OURS_BASELINE, OURS_EAGLE: OURS_BASELINE, OURS_HYBRID: OURS_BASELINE,
    OURS_EAGLE_TREE: OURS_BASELINE, OURS_MEDUSA: OURS_BASELINE, OURS_LAYER_SKIP: OURS_BASELINE, OURS_RETRIEVAL: OURS_BASELINE, HF_ASSISTED: HF_GENERATE, HF_LOOKUP: HF_GENERATE,
}
NEEDS_DRAFT_MODEL = (OURS_MODEL, HF_ASSISTED)
HF_LOOKUP_TOKENS = 10  # what HF's docs suggest and users copy
_OURS_DRAFTER = {
    OURS_BASELINE: "none", OURS_MODEL: "model", OURS_LOOKUP: "prompt_lookup", OURS_EAGLE: "eagle", OURS_HYBRID: "hybrid",
    OURS_EAGLE_TREE: "eagle",
    OURS_MEDUSA: "medusa",
    OURS_LAYER_SKIP: "layer_skip",
    OURS_RETRIEVAL: "retrieval",
}
# The most nodes a round may verify as a tree (engine.stream's tree_nodes): 0 chains only; None:
# the policy sizes them. Methods not named here verify chains, as they did before trees. Medusa's
# heads are verified as a candidate tree (the method's point); its drafter proposes chains where
# a tree can't be (sampled rounds, no room).
_TREE_NODES = {OURS_EAGLE_TREE: None, OURS_MEDUSA: None}


class OursMethod:
    """SpeculativeEngine with one drafter."""

    def __init__(self, name: str, engine, tree_nodes: int | None = 0) -> None:
        self.name, self.engine, self.target = name, engine, engine.target_model
        self.tree_nodes = tree_nodes

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        self.engine.forget()  # read the whole prompt, as generate() does: no reuse of the warm-up's cache
        # Sampled runs carry a seed (for Hugging Face's reproducibility); a seed would switch our
        # policy's cost gate off (reproducible draft lengths, drafting every round) where a chat,
        # which has no seed, drafts only when it pays: time what the chat runs.
        return self.engine.generate(prompt_ids, replace(params, seed=None), self.tree_nodes).token_ids


class HFMethod:
    """`model.generate()` made comparable: the same eos ids, an attention mask, batch 1, and a
    generation config holding only the token ids, so no repetition penalty or other extra the
    model's own generation config might carry changes what greedy means."""

    def __init__(self, name: str, target, tokenizer, draft=None) -> None:
        from transformers import GenerationConfig

        if name == HF_ASSISTED and draft is None:
            raise ValueError("hf-assisted needs the preset's draft model, and this preset has none")
        self.name, self.target, self.draft = name, target, draft
        eos = sorted(eos_token_ids(tokenizer, target))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
        bos = getattr(target.generation_config, "bos_token_id", None)
        self._clean = GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
        self._eos, self._pad = eos, pad

    def generation_config(self, params: SamplingParams):
        """Plain greedy (or plain sampling at the engine's temperature/top-k/top-p)."""
        from transformers import GenerationConfig

        sample = not params.greedy
        return GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=sample,
            temperature=params.temperature if sample else 1.0,
            top_k=params.top_k if sample else 0,  # 0: off, as in SamplingParams
            top_p=params.top_p if sample else 1.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            min_new_tokens=0,
            num_beams=1,
            eos_token_id=self._eos,
            pad_token_id=self._pad,
            prompt_lookup_num_tokens=HF_LOOKUP_TOKENS if self.name == HF_LOOKUP else None,
            use_cache=True,
        )

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        input_ids = torch.tensor([prompt_ids], device=self.target.device)
        extra = {"assistant_model": self.draft} if self.name == HF_ASSISTED else {}
        if params.seed is not None:
            torch.manual_seed(params.seed)
        with _generation_config(self.target, self._clean):
            output = self.target.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=self.generation_config(params),
                **extra,
            )
        return output[0, len(prompt_ids) :].tolist()


class LlamaCppMethod:
    """llama.cpp on the preset's GGUF file: plain greedy decoding of our prompt token ids.

    The prompt is tokenized by our chat template (the same ids every method reads); the model's
    cache is reset before each run, so it reads the whole prompt as the others do. Greedy is
    temp 0 (llama.cpp's greedy sampler) with no repetition penalty, min-p, top-k or top-p.
    It has no torch target to trace: every token counts as one plain round."""

    target = None  # nothing for trace_forwards to hook
    ttft_s: float | None = None  # the latest run's time to its first token

    def __init__(self, gguf_path, tokenizer, target, threads: int | None = None, context_tokens: int = 4096) -> None:
        from llama_cpp import Llama

        self.name, self.gguf_path = LLAMACPP, gguf_path
        self.llm = Llama(
            model_path=str(gguf_path),
            n_ctx=context_tokens,
            n_batch=512,
            n_threads=threads or os.cpu_count(),
            verbose=False,
        )
        self._eos = eos_token_ids(tokenizer, target)  # the same ids the other methods stop at

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        if not params.greedy:
            raise ValueError("llamacpp runs greedy only in this bench (--temperature 0)")
        self.llm.reset()
        out: list[int] = []
        started, self.ttft_s = time.perf_counter(), None
        for token in self.llm.generate(
            prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True
        ):
            if self.ttft_s is None:  # the first token: the prompt read (timed_run reads it after the run)
                self.ttft_s = time.perf_counter() - started
            if token in self._eos:
                break
            out.append(int(token))
            if len(out) >= params.max_new_tokens:
                break
        return out


def llamacpp_problem() -> str | None:
    """Why the llamacpp method can't run here (one line), or None."""
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llamacpp: llama-cpp-python is not installed ({LLAMACPP_INSTALL})"
    return None


@dataclass(frozen=True)
class VllmOptions:
    """Where the vllm methods come from: running servers ({method: URL}), else servers the bench
    starts with `python` (an interpreter that imports vllm), logging into `log_dir`."""

    python: str
    servers: dict[str, str] = field(default_factory=dict)
    log_dir: Path = Path(".")

    def problem(self, name: str) -> str | None:
        """Why vllm method `name` can't run here (one line), or None."""
        if name in self.servers:
            return server_problem(name, self.servers[name])
        return vllm_problem(self.python)


def available_methods(vllm: VllmOptions | None = None) -> tuple[str, ...]:
    """METHODS that can run here: llamacpp only where llama_cpp is importable; the vllm methods
    only where a server is given for them or vllm is importable by vllm.python."""
    def runs_here(name: str) -> bool:
        if name == LLAMACPP:
            return llamacpp_problem() is None
        if name in VLLM_METHODS:
            return vllm is not None and vllm.problem(name) is None
        return True

    return tuple(m for m in METHODS if runs_here(m))


def make_methods(names: list[str], models, threads: int | None = None, vllm: VllmOptions | None = None) -> list:
    """Build the named methods from a LoadedModels (see loading.load_preset). vLLM servers the
    bench starts are started together and stop when their methods close (close_methods)."""
    served = _served_methods([n for n in names if n in VLLM_METHODS], models, vllm)
    methods = []
    for name in names:
        if name in _OURS_DRAFTER:
            methods.append(OursMethod(name, models.make_engine(drafter=_OURS_DRAFTER[name]), _TREE_NODES.get(name, 0)))
        elif name in (HF_GENERATE, HF_ASSISTED, HF_LOOKUP):
            methods.append(HFMethod(name, models.target, models.tokenizer, models.draft))
        elif name == LLAMACPP:
            methods.append(LlamaCppMethod(_gguf_of(models), models.tokenizer, models.target, threads))
        elif name in served:
            methods.append(served[name])
        else:
            close_methods(served.values())
            raise ValueError(f"unknown method {name!r}; methods: {', '.join(METHODS)}")
    return methods


def close_methods(methods) -> None:
    """Stop what the methods hold outside this process (the vLLM servers the bench started)."""
    for method in methods:
        close = getattr(method, "close", None)
        if close is not None:
            close()


def _served_methods(names: list[str], models, vllm: VllmOptions | None) -> dict[str, ServedMethod]:
    """The vllm methods: a client of the server given for each, or of one started here. Every
    server is asked for the preset's target under the preset's name, where it lists it."""
    if not names:
        return {}
    if vllm is None:
        raise ValueError(f"{names[0]}: no vLLM server given and no interpreter to start one with")
    for name in names:
        problem = vllm.problem(name)
        if problem:
            raise ValueError(problem)
    to_start = [n for n in names if n not in vllm.servers]
    started = start_servers(to_start, vllm.python, *_vllm_model(models, VLLM_EAGLE in to_start),
                            vllm.log_dir) if to_start else {}
    served: dict[str, ServedMethod] = {}
    try:
        for name in names:
            server = started.get(name)
            url = server.url if server is not None else vllm.servers[name]
            served[name] = ServedMethod(name, url, server=server)
            served[name].model = _preferred_model(served[name], models.preset.name)
    except BaseException:
        close_methods(served.values())
        for server in started.values():
            server.stop()
        raise
    return served


def _vllm_model(models, with_head: bool) -> tuple[str, str, Path | None]:
    """What a started server serves: the folder the target loads from (a GGUF file's dequantised
    folder), its name (the preset's) and the preset's EAGLE head folder (when asked for)."""
    from ..presets.sources import resolve, resolve_head

    preset = models.preset
    head = resolve_head(preset.eagle) if with_head and preset.eagle is not None else None
    return resolve(preset.target).path, preset.name, head


def _preferred_model(method: ServedMethod, preset_name: str) -> str:
    """The preset's name where the server lists it (this project's API lists every preset), else
    the model the server serves."""
    return preset_name if preset_name in method.served_models() else method.model


def _gguf_of(models):
    """The preset target's GGUF file (llamacpp needs one)."""
    from ..presets.sources import gguf_file

    problem = llamacpp_problem()
    if problem:
        raise ValueError(problem)
    return gguf_file(models.preset.target)


def timed_run(method, prompt_ids: list[int], params: SamplingParams, messages: list[dict] | None = None) -> Run:
    """Generate once under the wall clock, tracing the target's forwards (a method with no torch
    target, llamacpp, decodes plainly: one round per token). A served method is asked for
    `messages`, the conversation prompt_ids were made from: the server applies its own chat template."""
    if isinstance(method, ServedMethod):
        if messages is None:
            raise ValueError(f"{method.name} asks a server: it needs the conversation, not only its token ids")
        reply = method.ask(messages, params)
        method.prompt_tokens_seen.append((len(prompt_ids), reply.prompt_tokens))
        return Run(method.name, reply.token_ids, reply.wall_s, reply.rounds, ttft_s=reply.ttft_s,
                   first_round_tokens=reply.first_tokens)
    if method.target is None:
        start = time.perf_counter()
        token_ids = method.generate(prompt_ids, params)
        wall_s = time.perf_counter() - start
        return Run(method.name, token_ids, wall_s, [(0, 0)] * len(token_ids),
                   ttft_s=getattr(method, "ttft_s", None))
    if isinstance(method, OursMethod):
        # Our engine counts its own rounds: a hook put on the model after compiling doesn't fire in compiled steps.
        start = time.perf_counter()
        token_ids = method.generate(prompt_ids, params)
        wall_s = time.perf_counter() - start
        stats = method.engine.stats
        return Run(method.name, token_ids, wall_s, list(stats.rounds), draft_s=stats.draft_s,
                   catch_up_s=stats.catch_up_s, ttft_s=stats.ttft_s, first_round_tokens=stats.first_round_tokens,
                   by_depth=(list(stats.drafted_by_position), list(stats.accepted_by_position)),
                   nodes=stats.node_acceptance)
    ends: list[float] = []
    with trace_forwards(method.target, ends) as calls:
        start = time.perf_counter()
        token_ids = method.generate(prompt_ids, params)
        wall_s = time.perf_counter() - start
    rounds = rounds_from_trace(calls, len(prompt_ids), len(prompt_ids) + len(token_ids))
    first_end = first_round_end(calls, ends, len(prompt_ids))
    return Run(method.name, token_ids, wall_s, rounds, ttft_s=None if first_end is None else first_end - start,
               first_round_tokens=rounds[0][1] + 1 if rounds else 1)


@contextmanager
def trace_forwards(model, ends: list[float] | None = None) -> Iterator[list[tuple[int, int]]]:
    """Record (tokens in the cache, new input tokens) for every forward call of `model`, and into
    `ends`, if given, the perf_counter time at which each call returned."""
    calls: list[tuple[int, int]] = []

    def hook(module, args, kwargs):
        input_ids = kwargs.get("input_ids")
        if input_ids is None and args:
            input_ids = args[0]
        cache = kwargs.get("cache")
        if cache is None:
            cache = kwargs.get("past_key_values")
        cached = cache.get_seq_length() if cache is not None else 0
        calls.append((int(cached), int(input_ids.shape[-1])))

    handles = [model.register_forward_pre_hook(hook, with_kwargs=True)]
    if ends is not None:
        handles.append(model.register_forward_hook(lambda *_: ends.append(time.perf_counter())))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def first_round_end(calls: list[tuple[int, int]], ends: list[float], prompt_len: int) -> float | None:
    """When the first decoding forward returned (a traced run's first token; see rounds_from_trace
    for which calls are prefills that yield nothing)."""
    for (cached, inputs), end in zip(calls, ends):
        if not (cached == 0 and inputs < prompt_len):
            return end
    return None


def rounds_from_trace(calls: list[tuple[int, int]], prompt_len: int, final_len: int) -> list[tuple[int, int]]:
    """(drafted, accepted) for each decoding forward, from (cached, inputs) per target call.

    A decoding forward runs the sequence's last token (or the whole prompt, for a first call
    over an empty cache) plus k drafted tokens, and yields the accepted drafts plus one token
    of its own; the next forward then starts at the new sequence length. So with S_i the
    sequence length when forward i starts, accepted_i = S_{i+1} - S_i - 1, and the last one is
    bounded by the final length. A prefill over fewer tokens than the prompt (the engine fills
    the cache with all but the last prompt token) yields nothing and is not a round.
    """
    starts: list[tuple[int, int]] = []  # (S_i, k_i)
    for cached, inputs in calls:
        if cached == 0:
            if inputs < prompt_len:
                continue  # prefill only
            starts.append((prompt_len, inputs - prompt_len))
        else:
            starts.append((cached + 1, inputs - 1))
    rounds = []
    for i, (start, drafted) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else final_len
        accepted = max(0, min(drafted, end - start - 1))
        rounds.append((drafted, accepted))
    return rounds


@contextmanager
def _generation_config(model, config) -> Iterator[None]:
    """Let `generate` see `config` as the model's own generation config, then put it back."""
    saved = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = saved
