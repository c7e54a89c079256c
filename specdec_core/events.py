"""What the engine emits: one TokenEvent per token, running Stats, and the final result."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

# Why a reply ended (Stats.finish_reason; a contract shared with the CLI and the API).
STOP = "stop"  # an end-of-sequence token or a stop string
LENGTH = "length"  # max_new_tokens reached
LENGTH_CONTEXT = "length (context)"  # the model's context limit cut the reply short
FINISH_REASONS = (STOP, LENGTH, LENGTH_CONTEXT)

# Where a token came from (a contract shared with the UI and the CLI).
DRAFT = "draft"  # proposed by the drafter and accepted by the target
RESAMPLED = "resampled"  # the target rejected the draft token here and drew its own
BONUS = "bonus"  # every draft of the round was accepted; the target's extra token
TARGET = "target"  # no draft at this step: baseline decoding, or nothing was proposed
SOURCES = (DRAFT, RESAMPLED, BONUS, TARGET)


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token_id: int
    text: str  # this token's piece of the decoded output ("" while a character is incomplete)
    source: str  # one of SOURCES
    round: int  # the verification round (one target forward) that produced it


@dataclass(frozen=True)
class RoundTally:
    """Rounds counted from the engine's per-round record, Stats.rounds: (drafted, accepted) of
    every target forward that decoded. The one fold the app's live prediction and the bench
    derive their round figures from."""

    rounds: int = 0
    plain_rounds: int = 0  # rounds with nothing drafted
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # drafting rounds that stopped at a rejected draft

    @classmethod
    def of(cls, rounds: Iterable[tuple[int, int]]) -> RoundTally:
        rounds = list(rounds)
        return cls(rounds=len(rounds), plain_rounds=sum(d == 0 for d, _ in rounds),
                   drafted=sum(d for d, _ in rounds), accepted=sum(a for _, a in rounds),
                   rejections=sum(a < d for d, a in rounds))


@dataclass
class Stats:
    """Running counters of one generation; the derived rates are properties."""

    draft_length: int = 0  # the drafter's current k
    new_tokens: int = 0
    target_forwards: int = 0  # every target forward pass, the prompt prefill included
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    ttft_s: float | None = None
    # Tokens of the round that gave the first token (its kept drafts and the target's own): they
    # came within the time to first token, so the decode rate counts only the tokens after them.
    first_round_tokens: int = 0
    # Prompt tokens the target read in this generation: those its kept cache didn't hold.
    prompt_tokens_read: int = 0
    wall_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    # One of FINISH_REASONS once the reply has ended; None while it runs, or if its consumer
    # stopped it early.
    finish_reason: str | None = None
    # (drafted, accepted) of every decoding round, in order: what the benchmark's theory check
    # is computed from (counted here: a hook put on the model after its steps were compiled doesn't fire inside them).
    # Not in as_dict: the API and the CLI report the totals above.
    rounds: list[tuple[int, int]] = field(default_factory=list, repr=False)
    # Rounds that verified a tree draft, the draft tokens (nodes) they verified, and the depth
    # of the paths they accepted, summed (their drafts count in the totals above as well).
    tree_rounds: int = 0
    tree_nodes_verified: int = 0
    tree_accepted_depth: int = 0

    @property
    def mean_accepted_depth(self) -> float:
        """Tokens accepted per tree round (the accepted path's depth, on average)."""
        return self.tree_accepted_depth / self.tree_rounds if self.tree_rounds else 0.0

    @property
    def tokens_per_target_forward(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def drafts(self) -> int:
        """Rounds that drafted (vLLM's num_drafts): every draft fills its first position."""
        return self.drafted_by_position[0] if self.drafted_by_position else 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """The decode-phase rate: tokens after the first round's, over the engine time after the
        first token. The time to first token (reading the prompt, however much of it a kept cache
        spared) is left out, so two replies that read different prompts compare; 0.0 until a
        round after the first has given a token."""
        tokens = self.new_tokens - self.first_round_tokens
        seconds = self.wall_s - self.ttft_s if self.ttft_s is not None else 0.0
        return tokens / seconds if tokens > 0 and seconds > 0 else 0.0

    def record_round(self, drafted: int, accepted: int, draft_s: float = 0.0, verify_s: float = 0.0,
                     tree_depth: int | None = None) -> None:
        """Count one verification round in which `drafted` tokens were proposed; a tree of
        `drafted` nodes `tree_depth` deep fills the positions (depths) 1..tree_depth."""
        self.draft_s += draft_s
        self.verify_s += verify_s
        if tree_depth is not None:
            self.tree_rounds += 1
            self.tree_nodes_verified += drafted
            self.tree_accepted_depth += accepted
        depth = drafted if tree_depth is None else tree_depth
        grow = depth - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        for position in range(depth):
            self.drafted_by_position[position] += 1
        for position in range(accepted):
            self.accepted_by_position[position] += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        self.rounds.append((drafted, accepted))

    def tally(self) -> RoundTally:
        """The rounds so far, counted (what the live prediction and the bench are computed from)."""
        return RoundTally.of(self.rounds)

    def as_dict(self) -> dict:
        fields = asdict(self)
        del fields["rounds"]
        return {
            **fields,
            "tokens_per_target_forward": self.tokens_per_target_forward,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_second": self.tokens_per_second,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "mean_accepted_depth": self.mean_accepted_depth,
        }


@dataclass(frozen=True)
class GenerationResult:
    token_ids: list[int]
    text: str
    sources: list[str]
    stats: Stats
