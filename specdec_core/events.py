"""What the engine emits: one TokenEvent per token, running Stats, and the final result."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields

from .theory import path_probability, rank_paths

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


@dataclass(frozen=True)
class TreeRound:
    """One verified tree draft, as the app's tree view draws it: the drafted tokens with their
    parents (as Draft.parents: -1 is the context's last token), the accepted path (node indices
    from the root, in order) and the target's own token that closed the round, with its source
    (BONUS when the path ended at a leaf, else RESAMPLED)."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    path: tuple[int, ...]
    token: int
    source: str


@dataclass
class NodeAcceptance:
    """Every drafting round's nodes counted by place (depth, sibling rank): how many had their
    parent on the accepted path (reached: the target weighed them) and how many were kept. A
    chain is the one-child tree, so chain rounds count alike (rank 0 at every depth).

    From these, the per-node acceptance rates and the expected tokens per drafting round of the
    trees that were drafted (theory.expected_tree_tokens, summed over `shapes`): the theory line
    of tree drafts, set beside the tokens the rounds measured."""

    rounds: int = 0  # drafting rounds
    tree_rounds: int = 0  # of them, rounds that verified a tree draft
    nodes: int = 0  # draft tokens drafted, summed
    kept_depth: int = 0  # accepted paths' lengths, summed
    reached: Counter = field(default_factory=Counter)  # (depth, rank) -> nodes whose parent was kept
    kept: Counter = field(default_factory=Counter)  # (depth, rank) -> nodes kept
    offered: Counter = field(default_factory=Counter)  # depth -> rounds whose path reached a node with children there
    shapes: Counter = field(default_factory=Counter)  # a node's ranks from the root -> nodes drafted there

    def add(self, parents: Sequence[int], path: Sequence[int], tree: bool = True) -> None:
        """One drafting round: a draft with these parents, of which the nodes `path` were kept."""
        ranks = rank_paths(list(parents))
        kept_rows = [0, *(node + 1 for node in path)]  # rows at depth 0, 1, ...: the path's
        on_path, parent_rows = set(path), {parent + 1 for parent in parents}
        for node, parent in enumerate(parents):
            place = (len(ranks[node]), ranks[node][-1])
            self.shapes[ranks[node]] += 1
            if parent + 1 in kept_rows:
                self.reached[place] += 1
                self.kept[place] += node in on_path
        for depth, row in enumerate(kept_rows, start=1):
            self.offered[depth] += row in parent_rows
        self.rounds += 1
        self.tree_rounds += tree
        self.nodes += len(parents)
        self.kept_depth += len(path)

    def add_chain(self, drafted: int, accepted: int) -> None:
        """A chain round: `drafted` tokens, the first `accepted` kept."""
        self.add(range(-1, drafted - 1), range(accepted), tree=False)

    def merge(self, other: NodeAcceptance) -> None:
        self.rounds += other.rounds
        self.tree_rounds += other.tree_rounds
        self.nodes += other.nodes
        self.kept_depth += other.kept_depth
        for mine, theirs in ((self.reached, other.reached), (self.kept, other.kept),
                             (self.offered, other.offered), (self.shapes, other.shapes)):
            mine.update(theirs)

    def rates(self) -> dict[tuple[int, int], float]:
        """(depth, rank) -> the share of nodes there kept once their parent was."""
        return {place: self.kept[place] / n for place, n in self.reached.items() if n}

    def acceptance_by_depth(self) -> list[float]:
        """Per depth d = 1, 2, ...: of the rounds whose path reached depth d - 1 at a node the
        draft went on from, the share that kept a node at depth d (a chain's acceptance at
        position d once the drafts before it were kept)."""
        kept_at: Counter = Counter()
        for (depth, _), n in self.kept.items():
            kept_at[depth] += n
        deepest = max((d for d, n in self.offered.items() if n), default=0)
        return [kept_at[d] / self.offered[d] if self.offered[d] else 0.0 for d in range(1, deepest + 1)]

    def expected_tokens(self) -> float:
        """Tokens per drafting round the per-node rates predict for the drafts that were made:
        the mean over rounds of theory.expected_tree_tokens (1.0 before a drafting round)."""
        if not self.rounds:
            return 1.0
        rates = self.rates()
        return 1.0 + sum(n * path_probability(ranks, rates) for ranks, n in self.shapes.items()) / self.rounds

    def measured_tokens(self) -> float:
        """Tokens per drafting round measured: the accepted path and the target's own token."""
        return 1.0 + self.kept_depth / self.rounds if self.rounds else 1.0

    def as_dict(self) -> dict:
        by_rank: dict[str, list[float]] = {}
        for (depth, rank), rate in sorted(self.rates().items()):
            at_depth = by_rank.setdefault(str(depth), [])
            at_depth.extend([0.0] * (rank + 1 - len(at_depth)))  # a rank never reached reads 0
            at_depth[rank] = rate
        return {
            "drafting_rounds": self.rounds,
            "tree_rounds": self.tree_rounds,
            "nodes_per_drafting_round": self.nodes / self.rounds if self.rounds else 0.0,
            "acceptance_by_depth": self.acceptance_by_depth(),
            "node_acceptance_by_depth_and_rank": by_rank,
            "expected_tokens_per_drafting_round": self.expected_tokens(),
            "measured_tokens_per_drafting_round": self.measured_tokens(),
        }


# Stats' per-round records: read by the app and the bench, left out of as_dict (the API and
# the CLI report the totals).
_RECORDS = ("rounds", "last_tree", "node_acceptance")


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
    catch_up_s: float = 0.0  # of draft_s: the drafter reading what it missed (a new prompt, plain rounds)
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
    # The latest tree round as verified (the app draws it), and every drafting round's nodes by
    # place (the tree theory's per-node acceptance). Not in as_dict, as `rounds`.
    last_tree: TreeRound | None = field(default=None, repr=False)
    node_acceptance: NodeAcceptance = field(default_factory=NodeAcceptance, repr=False)

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
                     tree_depth: int | None = None, tree: TreeRound | None = None) -> None:
        """Count one verification round in which `drafted` tokens were proposed; a tree of
        `drafted` nodes `tree_depth` deep fills the positions (depths) 1..tree_depth. `tree`:
        the tree round itself (its nodes and path; the app draws the latest)."""
        self.draft_s += draft_s
        self.verify_s += verify_s
        if tree is not None:
            self.last_tree = tree
            self.node_acceptance.add(tree.parents, tree.path)
        elif drafted:
            self.node_acceptance.add_chain(drafted, accepted)
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
        # Copies: the app keeps a finished half's dict while the engine runs on.
        figures = {f.name: _copied(getattr(self, f.name)) for f in fields(self) if f.name not in _RECORDS}
        return {
            **figures,
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


def _copied(value):
    return list(value) if isinstance(value, list) else value
