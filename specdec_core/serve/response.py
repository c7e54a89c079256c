"""OpenAI-shaped response bodies, with the speculative stats (`speculative`, and llama.cpp's
`timings` names so clients written for its server read them) and per-token provenance."""

from __future__ import annotations

import time
import uuid

from ..events import Stats
from .completion import Completion, Piece


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def speculative(stats: Stats, drafter: str) -> dict:
    """The engine's draft statistics. Definitions as vLLM's: a round that drafted is one draft;
    mean acceptance length = 1 + accepted / drafts; position i's rate = accepted at i / drafts."""
    drafts = stats.drafts
    return {
        "drafter": drafter,
        "drafts": drafts,
        "drafted_tokens": stats.drafted_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "acceptance_rate": stats.acceptance_rate,
        "mean_acceptance_length": 1 + stats.accepted_tokens / drafts if drafts else 1.0,
        "acceptance_rate_per_position": [accepted / drafts for accepted in stats.accepted_by_position] if drafts else [],
        "tokens_per_target_forward": stats.tokens_per_target_forward,
        "tokens_per_second": stats.tokens_per_second,  # end to end: the prompt reading included
        # the decode phase: tokens after the first round over the time after the first token, the
        # rate every speedup the app shows compares (Stats.decode_tokens_per_second)
        "decode_tokens_per_second": stats.decode_tokens_per_second,
        "ttft_s": stats.ttft_s,
        # tree drafts: rounds that verified a tree, the draft tokens (nodes) they verified, and
        # the accepted path's depth per such round (their drafts count in the totals above too)
        "tree_rounds": stats.tree_rounds,
        "tree_nodes_verified": stats.tree_nodes_verified,
        "mean_accepted_depth": stats.mean_accepted_depth,
    }


def timings(stats: Stats, prompt_tokens: int) -> dict:
    """llama.cpp server's `timings` names for the same numbers."""
    return {
        "prompt_n": prompt_tokens,
        "predicted_n": stats.new_tokens,
        "predicted_ms": stats.wall_s * 1000,
        "predicted_per_token_ms": stats.wall_s * 1000 / stats.new_tokens if stats.new_tokens else 0.0,
        "predicted_per_second": stats.tokens_per_second,
        "draft_n": stats.drafted_tokens,
        "draft_n_accepted": stats.accepted_tokens,
    }


def usage(job: Completion) -> dict:
    prompt = len(job.prompt_ids)
    return {"prompt_tokens": prompt, "completion_tokens": job.completion_tokens,
            "total_tokens": prompt + job.completion_tokens}


def _stats_fields(job: Completion) -> dict:
    return {"speculative": speculative(job.stats, job.drafter), "timings": timings(job.stats, len(job.prompt_ids))}


def chat_completion(job: Completion, pieces: list[Piece]) -> dict:
    """The whole reply as one `chat.completion` object."""
    message = {"role": "assistant", "content": "".join(p.text for p in pieces)}
    if job.request.return_sources:
        message["token_ids"] = [t for p in pieces for t in p.token_ids]
        message["sources"] = [s for p in pieces for s in p.sources]
    return {
        "id": completion_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": job.models.preset.name,
        "choices": [{"index": 0, "message": message, "finish_reason": job.finish_reason, "logprobs": None}],
        "usage": usage(job),
        **_stats_fields(job),
    }


class ChunkWriter:
    """The `chat.completion.chunk` objects of one streamed reply, all with the same id."""

    def __init__(self, job: Completion) -> None:
        self._job = job
        self._id = completion_id()
        self._created = int(time.time())

    def _chunk(self, choices: list, **extra) -> dict:
        return {"id": self._id, "object": "chat.completion.chunk", "created": self._created,
                "model": self._job.models.preset.name, "choices": choices, **extra}

    def first(self) -> dict:
        return self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])

    def piece(self, piece: Piece) -> dict:
        delta = {"content": piece.text}
        if self._job.request.return_sources:
            delta["token_ids"], delta["sources"] = piece.token_ids, piece.sources
        return self._chunk([{"index": 0, "delta": delta, "finish_reason": None}])

    def last(self) -> dict:
        """The chunk with finish_reason, and the reply's speculative stats and timings."""
        return self._chunk([{"index": 0, "delta": {}, "finish_reason": self._job.finish_reason}],
                           **_stats_fields(self._job))

    def usage(self) -> dict:
        """With stream_options.include_usage: the extra last chunk, no choices, the usage."""
        return self._chunk([], usage=usage(self._job))
