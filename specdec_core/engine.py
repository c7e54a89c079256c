"""The speculative decoding loop: propose, verify, accept, roll back, adapt.

Invariant between rounds: the target's cache holds every token of the context except the
last one, so one target forward over [last, d1..dk] yields the k+1 distributions a round needs
(and with no draft it is a plain decoding step, which is how the baseline runs).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .acceptance import greedy_accept, greedy_accept_tree, speculative_accept, speculative_accept_tree
from .chat import eos_token_ids
from .decoding.base import context_limit
from .decoding.eager import CachedModel, KeptRunner
from .decoding.features import feature_tap
from .decoding.tree import check_parents, is_chain_prefix
from .detok import IncrementalDetokenizer
from .drafter import Draft, Drafter
from .errors import PromptTooLong
from .events import (
    BONUS, DRAFT, LENGTH, LENGTH_CONTEXT, RESAMPLED, STOP, TARGET, GenerationResult, Stats, TokenEvent, TreeRound,
)
from .policy import DEFAULT_DRAFT_LENGTH, DraftLengthPolicy
from .sampling import SamplingParams, make_generator, probabilities
from .stop_text import StopText


class SpeculativeEngine:
    """Lossless speculative decoding of one target model with a pluggable drafter.

    drafter=None decodes plainly through the same code (the fair baseline). One engine serves
    one generation at a time; `stats` holds the running numbers of the latest one. It keeps
    the KV caches of the last generation, so a prompt that starts with it (a chat's next turn)
    reads only its new tokens; `forget()` drops them.
    """

    def __init__(
        self,
        target_model,
        tokenizer,
        drafter: Drafter | None = None,
        draft_length: int = DEFAULT_DRAFT_LENGTH,
        adaptive: bool = True,
        make_runner: Callable[[object], CachedModel] = CachedModel,
        kept: KeptRunner | None = None,
    ) -> None:
        """make_runner: builds the object that owns the target's KV cache, kept from one
        generation to the next (CachedModel, or a static-cache runner with the same
        forward/crop/length interface). kept: the target's kept cache, to share with other
        engines of the same model (one kept conversation however many engines; only one of them
        generates at a time); None: one of its own, made with make_runner."""
        # One policy for the engine's lifetime: measured step costs and acceptance carry over
        # from one reply to the next, so a draft that can't pay here isn't probed afresh each time.
        self.drafter = drafter if drafter is not None else Drafter()
        self.policy = self._new_policy(draft_length, adaptive, timed=True)  # also validates draft_length
        self.target_model = target_model.eval()
        self.tokenizer = tokenizer
        self.drafter.bind(self.target_model, tokenizer)
        # The target layers the drafter reads (none for most): captured during our own forwards.
        self._tap = feature_tap(self.target_model, self.drafter.feature_layers)
        self.draft_length = draft_length
        self.adaptive = adaptive
        self.make_runner = make_runner
        if kept is not None and kept.model is not self.target_model:
            raise ValueError("the kept cache belongs to another model than this engine's target")
        self._target = kept or KeptRunner(make_runner, self.target_model)  # a chat's earlier turns stay read
        self.eos_ids = eos_token_ids(tokenizer, self.target_model)
        self.context_limit = context_limit(self.target_model)
        self.stats = Stats(draft_length=draft_length)

    @property
    def speculative(self) -> bool:
        return type(self.drafter) is not Drafter

    def generate(self, prompt_ids: list[int], params: SamplingParams, tree_nodes: int | None = None) -> GenerationResult:
        """Run to the end; the tokens, text, sources and stats of the whole reply."""
        events = list(self.stream(prompt_ids, params, tree_nodes))
        return GenerationResult(
            token_ids=[e.token_id for e in events],
            text="".join(e.text for e in events),
            sources=[e.source for e in events],
            stats=self.stats,
        )

    def stream(self, prompt_ids: list[int], params: SamplingParams, tree_nodes: int | None = None) -> Iterator[TokenEvent]:
        """Yield one TokenEvent per generated token, as soon as its round is verified.

        tree_nodes: the most draft tokens a round may verify as a tree (0: chains only; None:
        the policy decides), within what the target's runner verifies.

        Lazy: nothing runs between events unless the consumer asks for the next one, so a
        consumer that stops iterating (or closes the generator) stops the computation.
        """
        context = self.checked_prompt(prompt_ids)
        if params.seed is not None:
            # Reproducible: read the whole prompt, as a fresh engine would (a kept cache holds
            # earlier tokens computed in other chunks, which round differently).
            self.forget()
        room_in_context = self.context_limit - len(context)
        budget = min(params.max_new_tokens, room_in_context)
        self.drafter.reset(context)  # first: it may need the target's features from further back
        target = self._target.start(context, at_most=self.drafter.features_from())  # a new generation
        policy = self._policy_for(params)
        call = _Call(
            params=params,
            context=context,
            target=target,
            policy=policy,
            tree_nodes=policy.tree_nodes(tree_nodes, target.max_tree_nodes),
            output=_Output(self.tokenizer, self.eos_ids, params.stop, budget,
                           length_reason=LENGTH if params.max_new_tokens <= room_in_context else LENGTH_CONTEXT),
            generator=make_generator(params.seed, self.target_model.device),
        )
        generation = self._target.generation  # only the latest generation may keep what it read
        self.drafter.use_costs(call.policy.costs)  # untimed with a seed: so are the drafter's choices
        stats = self.stats = Stats(draft_length=call.policy.k, prompt_tokens_read=len(context) - call.target.length)
        clock = _EngineClock()
        try:
            self._prefill(call)
            round_number = 0
            while True:
                round_number += 1
                if generation != self._target.generation:
                    raise RuntimeError("another generation started on this model's kept cache: "
                                       "an engine (and the engines sharing its cache) serves one at a time")
                for token_id, source in self._round(call):
                    context.append(token_id)
                    event = call.output.add(token_id, source, round_number)
                    stats.new_tokens += 1
                    stats.first_round_tokens += round_number == 1
                    stats.wall_s = clock.pause()
                    if stats.ttft_s is None:
                        stats.ttft_s = stats.wall_s
                    stats.finish_reason = call.output.finish_reason
                    yield event
                    clock.resume()
                    if call.output.done:
                        return
        except BaseException as error:
            # A consumer that stops iterating stops us between rounds, with whole caches; any
            # other exception may have stopped a forward halfway, and then nothing kept is sound.
            if not isinstance(error, GeneratorExit) and generation == self._target.generation:
                self.forget()
            raise
        finally:
            # Keep what was read for the next generation (no-ops after forget), unless a newer
            # one has started meanwhile (this stream was abandoned, and closed only now).
            if generation == self._target.generation:
                self._target.finish(context)
                self.drafter.release(context)

    def step_s(self, tokens: int) -> float | None:
        """What a target forward over `tokens` tokens costs now, as the draft policy measured it
        (None until measured): the plain step (1) and the verify steps a speedup is predicted from."""
        return self.policy.costs.target(tokens)

    def measured_plain_step_s(self) -> float | None:
        """The running average of this engine's measured 1-token steps (None before the first)."""
        return self.policy.costs.target_s.get(1)

    def _policy_for(self, params: SamplingParams) -> DraftLengthPolicy:
        """The engine's learning policy; with a seed, a fresh one that ignores timings, so the
        draft lengths, and with them the random draws, depend only on the tokens."""
        if params.seed is None:
            return self.policy
        return self._new_policy(self.draft_length, self.adaptive, timed=False)

    def _new_policy(self, draft_length: int, adaptive: bool, timed: bool) -> DraftLengthPolicy:
        return DraftLengthPolicy(draft_length, adaptive, timed=timed, drafter_chooses=self.drafter.chooses_length)

    def share_reading(self, prompt_ids: list[int], at_most: int | None = None) -> int:
        """Crop the target's kept cache to where this engine would start reading `prompt_ids`
        (and to at most `at_most` tokens); returns how many tokens it keeps.

        The app's side by side calls it before each half: before the baseline, an engine sharing
        the cache, and before this engine's own half with the baseline's start as `at_most`. So
        both halves read the same prompt tokens from the same cache state in one call of the
        same size: their times to first token compare, and the greedy replies can't part at a
        tie of two logits that a token read in a call of another size rounds apart in its last
        bits (the 4-bit layers' long calls, the stock attention of prompts). A drafter that reads
        the target's features (EAGLE) makes this engine start further back."""
        context = self.checked_prompt(prompt_ids)
        self.drafter.reset(context)
        start = self.drafter.features_from()
        if at_most is not None:
            start = at_most if start is None else min(start, at_most)
        return self._target.keep_shared(context, at_most=start).length

    def forget(self) -> None:
        """Drop what the target and the drafter kept from earlier generations, so the next one
        reads its whole prompt (the benchmark starts every timed run like this)."""
        self._target.drop()
        self.drafter.release(None)

    def _round(self, call: _Call) -> list[tuple[int, str]]:
        """One round: propose, verify, accept, roll back, adapt. Returns (token, source) pairs."""
        context, policy = call.context, call.policy
        lag = self.drafter.lag(context)
        room = call.output.remaining - 1  # the round's own token takes one: never past max_new_tokens
        k = policy.next_draft_length(room, lag, call.tree_nodes)
        if k > 0 and lag > 0:
            self._catch_up_drafter(call, lag)
        started = time.perf_counter()
        draft = self._propose(call, k) if k > 0 else Draft([])
        drafted = time.perf_counter()
        logits = self._verify(call.target, context[-1], draft)
        path, token = self._accept(logits, draft, call.params, call.generator)
        verified = time.perf_counter()
        kept_rows = [0, *(node + 1 for node in path)]  # the verify step's rows that stand: the last token, the path
        _roll_back(call.target, len(context) - 1, kept_rows)  # forget the rejected drafts
        # The target features that stand, taken before the guess below can run the target's
        # modules (Medusa reads out through its final norm, which the tap hooks).
        features = self._standing_features(kept_rows)
        if k == 0 and policy.drafting_is_free():  # keep learning from the drafter at no cost
            self._compare_a_guess(call, token)
        self._observe(len(context) - 1, features)
        if draft.tokens:  # a plain round verified no draft: nothing to tell the drafter
            self.drafter.accepted_path(path)
        n, tree_depth = len(path), (draft.depth if draft.parents is not None else None)
        sources = _sources(len(draft.tokens), n, draft.is_leaf(path[-1] if path else -1))
        # A tree round is kept as verified (its nodes, path and closing token): the app draws it.
        tree = (TreeRound(tuple(draft.tokens), tuple(draft.parents), tuple(path), token, sources[-1])
                if draft.parents is not None and draft.tokens else None)
        policy.update(len(draft.tokens), n, drafted - started, verified - drafted, depth=tree_depth,
                      line=draft.first_ranked_line(path))
        self.stats.record_round(len(draft.tokens), n, drafted - started, verified - drafted, tree_depth=tree_depth,
                                tree=tree)
        self.stats.draft_length = policy.k
        tokens = [draft.tokens[node] for node in path] + [token]
        return list(zip(tokens, sources))

    def _compare_a_guess(self, call: _Call, token: int) -> None:
        """A plain round: ask the drafter for one token, unverified, and tell the policy whether it
        is the target's. Asked as at a round's start, before this round's features reach the
        drafter: one that reads them (Medusa) guesses the token after the context from the row
        before them."""
        guess = self.drafter.propose(call.context, 1, call.params, call.generator).tokens
        self.drafter.unverified()
        if guess:
            call.policy.observe_unverified(guess[0] == token)

    def _propose(self, call: _Call, k: int) -> Draft:
        """The drafter's draft of at most k tokens deep: a chain, or a tree of at most the
        call's tree_nodes tokens (ValueError for a drafter that breaks those bounds)."""
        nodes = call.policy.tree_budget(call.tree_nodes)  # the policy sizes the tree by what it measured
        draft = self.drafter.propose_tree(call.context, k, nodes, call.params, call.generator)
        if draft.parents is not None:
            check_parents(draft.parents)
            if len(draft.parents) != len(draft.tokens) or len(draft.tokens) > nodes or draft.depth > k:
                raise ValueError(f"the {self.drafter.name} drafter proposed a tree of {len(draft.tokens)} tokens, "
                                 f"{draft.depth} deep, with {len(draft.parents)} parents: at most "
                                 f"{nodes} tokens, {k} deep, one parent per token")
        return draft

    def _catch_up_drafter(self, call: _Call, lag: int) -> None:
        """Let the drafter read what it missed (a new prompt, plain rounds), timed on its own:
        the policy prices a probe by it, and it must not inflate the per-token drafting cost."""
        started = time.perf_counter()
        self.drafter.catch_up(call.context)
        seconds = time.perf_counter() - started
        call.policy.costs.record_catch_up(lag, seconds)
        self.stats.draft_s += seconds
        self.stats.catch_up_s += seconds

    def checked_prompt(self, prompt_ids: list[int]) -> list[int]:
        """The prompt as a list of ints; ValueError if it is empty, PromptTooLong if the target
        can't read it (and reply). The one check of a prompt's length: the app and the API call it."""
        context = [int(t) for t in prompt_ids]
        if not context:
            raise ValueError("prompt is empty: give at least one token (type a message)")
        if len(context) >= self.context_limit:
            raise PromptTooLong(len(context), self.context_limit)
        return context

    def _prefill(self, call: _Call) -> None:
        """Fill the target's cache with all but the last prompt token (see the invariant); the
        part an earlier generation left in it is not read again."""
        unread = call.context[call.target.length : -1]
        if unread:
            started = time.perf_counter()
            position = call.target.length
            self._tap.start()
            call.target.forward(unread, last_only=True)
            self._observe(position, self._standing_features(len(unread)))
            self.stats.target_forwards += 1
            self.stats.verify_s += time.perf_counter() - started

    def _verify(self, target: CachedModel, last_token: int, draft: Draft) -> torch.Tensor:
        """One target forward over [last, d1..dk] -> [k+1, V] logits; a tree's with its tree
        attention (row i + 1 scores what follows token i's path)."""
        self.stats.target_forwards += 1
        self._tap.start()
        if draft.parents is None:
            return target.forward([last_token, *draft.tokens])
        return target.forward_tree([last_token, *draft.tokens], draft.parents)

    def _standing_features(self, rows: int | list[int]) -> torch.Tensor | None:
        """The features the last target forward captured for its rows `rows` (a count: the first
        ones); None where the drafter reads none."""
        features = self._tap.take()
        if features is None:
            return None
        if isinstance(rows, int) or is_chain_prefix(rows):
            return features[: rows if isinstance(rows, int) else len(rows)]
        return features[torch.tensor(rows, device=features.device)]

    def _observe(self, position: int, features: torch.Tensor | None) -> None:
        """Hand a drafter that reads features those of sequence positions from `position`."""
        if features is not None:
            self.drafter.observe(features, position)

    @staticmethod
    def _accept(
        logits: torch.Tensor, draft: Draft, params: SamplingParams, generator: torch.Generator
    ) -> tuple[list[int], int]:
        """The draft tokens the target keeps (a path from the root, as indices into
        draft.tokens; a chain's first n), and the token it adds after them."""
        if params.greedy:
            if draft.parents is not None:
                return greedy_accept_tree(logits.argmax(dim=-1), draft.tokens, draft.parents)
            n, token = greedy_accept(logits.argmax(dim=-1), draft.tokens)
            return list(range(n)), token
        p = probabilities(logits, params)
        q = draft.probs if draft.probs is not None else _one_hot(draft.tokens, p.shape[-1], p.device)
        if draft.parents is not None:
            return speculative_accept_tree(p, q, draft.tokens, draft.parents, generator)
        n, token = speculative_accept(p, q, draft.tokens, generator)
        return list(range(n)), token


def _roll_back(target: CachedModel, start: int, rows: list[int]) -> None:
    """After a verify step from `start` cached tokens, keep its rows `rows`: a chain's first
    rows are a crop; a tree's accepted path moves into place (keep_rows)."""
    if is_chain_prefix(rows):
        target.crop(start + len(rows))
    else:
        target.keep_rows(start, rows)


def _sources(drafted: int, accepted: int, ended_at_leaf: bool) -> list[str]:
    """Provenance of the accepted drafts and of the target's token that closes the round: a
    bonus when the accepted path ran to the end of the draft (a leaf), else a resample."""
    if drafted == 0:
        closing = TARGET
    elif ended_at_leaf:
        closing = BONUS
    else:
        closing = RESAMPLED
    return [DRAFT] * accepted + [closing]


def _one_hot(tokens: list[int], vocab: int, device) -> torch.Tensor:
    """The distributions of a deterministic drafter: all mass on the proposed token."""
    q = torch.zeros(len(tokens), vocab, device=device)
    if tokens:
        q[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
    return q


@dataclass
class _Call:
    """The state of one generation; it lives and dies with its stream."""

    params: SamplingParams
    context: list[int]  # prompt + reply so far
    target: CachedModel  # the target's KV cache, kept from the engine's last generation
    policy: DraftLengthPolicy  # the engine's, or with a seed one of the call's own
    tree_nodes: int  # the most draft tokens a round may verify as a tree (0: chains only)
    output: _Output
    generator: torch.Generator


class _Output:
    """The reply so far: token ids, sources, text, and whether a stop condition was hit."""

    def __init__(self, tokenizer, eos_ids: set[int], stop_strings: tuple[str, ...], budget: int,
                 length_reason: str = LENGTH) -> None:
        """length_reason: what running out of `budget` means (max_new_tokens, or the context)."""
        self._detok = IncrementalDetokenizer(tokenizer)
        self._eos_ids = eos_ids
        self._text = StopText(stop_strings)  # the events' text: the reply up to the first stop string
        self._budget = budget
        self._length_reason = length_reason
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None  # set when done

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        return self._budget - len(self.token_ids)

    def add(self, token_id: int, source: str, round_number: int) -> TokenEvent:
        """The event of the reply's next token. Its text is what the token makes certain of the
        reply: without stop strings its own piece (the pieces add up to the full decode); with
        them, text that could still begin a stop string waits for the next tokens."""
        self.token_ids.append(token_id)
        text = self._text.push(self._detok.push(token_id))
        if token_id in self._eos_ids or self._text.hit:
            self.finish_reason = STOP
        elif self.remaining <= 0:
            self.finish_reason = self._length_reason
        if self.done:
            text += self._text.push(self._detok.flush()) + self._text.flush()
        return TokenEvent(token_id=token_id, text=text, source=source, round=round_number)


class _EngineClock:
    """Engine time only: the clock pauses while the consumer holds a yielded event."""

    def __init__(self) -> None:
        self._elapsed = 0.0
        self._since = time.perf_counter()

    def pause(self) -> float:
        self._elapsed += time.perf_counter() - self._since
        return self._elapsed

    def resume(self) -> None:
        self._since = time.perf_counter()
