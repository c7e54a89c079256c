"""What one timed generation of a bench method measured (Run), and the counters summed over runs
that the report and the theory check are computed from (RunTotals)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..events import NodeAcceptance, RoundTally


@dataclass
class Run:
    """One timed generation of one method."""

    method: str
    token_ids: list[int]
    wall_s: float
    rounds: list[tuple[int, int]]  # (drafted, accepted) per decoding forward of the target
    # Seconds our engine spent drafting (proposals and the drafter's catch-up); None for methods
    # that don't say (Hugging Face's, llama.cpp), whose drafting cost the theory check probes.
    draft_s: float | None = None
    catch_up_s: float = 0.0  # of draft_s: the drafter's catch-up (Stats.catch_up_s)
    # Seconds to the first token (the prompt reading and the first round), and that round's tokens:
    # what the decode-phase figures leave out. None: not measured (the decode figures then count
    # the whole run).
    ttft_s: float | None = None
    first_round_tokens: int = 1
    # Rounds that drafted / kept at each depth (draft position), as the engine counted them: a
    # tree round fills depths 1..its depth, not one position per node. None: from `rounds`.
    by_depth: tuple[list[int], list[int]] | None = None
    # Every drafting round's nodes by place, as the engine counted them (Stats.node_acceptance):
    # the tree theory's per-node acceptance. None: the rounds were chains, counted from `rounds`.
    nodes: NodeAcceptance | None = None

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def decode_phase(self) -> tuple[int, float]:
        """(tokens, seconds) after the first token: the tokens after the first round's."""
        if self.ttft_s is None:
            return self.new_tokens, self.wall_s
        return max(self.new_tokens - self.first_round_tokens, 0), max(self.wall_s - self.ttft_s, 0.0)


@dataclass
class RunTotals:
    """Counters summed over runs; what the report and the theory check are computed from."""

    new_tokens: int = 0
    wall_s: float = 0.0
    rounds: int = 0  # target decoding forwards (a prefill that yields no token is not one)
    plain_rounds: int = 0  # rounds with nothing drafted
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # drafting rounds that stopped at a rejected token
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    draft_s: float = 0.0  # drafting seconds our engine measured
    catch_up_s: float = 0.0  # of draft_s: the drafter's catch-up
    draft_measured: bool = True  # False once a run without them was added
    runs: int = 0
    ttft_s: float = 0.0  # summed over the runs
    decode_tokens: int = 0  # tokens after each run's first round
    decode_s: float = 0.0  # seconds after each run's first token
    nodes: NodeAcceptance = field(default_factory=NodeAcceptance)  # drafting rounds' nodes by place

    def add(self, run: Run) -> None:
        if run.draft_s is None:
            self.draft_measured = False
        else:
            self.draft_s += run.draft_s
            self.catch_up_s += run.catch_up_s
        self.new_tokens += run.new_tokens
        self.wall_s += run.wall_s
        self.runs += 1
        self.ttft_s += run.ttft_s if run.ttft_s is not None else run.wall_s
        tokens, seconds = run.decode_phase
        self.decode_tokens += tokens
        self.decode_s += seconds
        tally = RoundTally.of(run.rounds)
        self.rounds += tally.rounds
        self.plain_rounds += tally.plain_rounds
        self.drafted += tally.drafted
        self.accepted += tally.accepted
        self.rejections += tally.rejections
        drafted_by_depth, accepted_by_depth = run.by_depth or _by_position(run.rounds)
        grow = len(drafted_by_depth) - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position += [0] * grow
            self.accepted_by_position += [0] * grow
        for position, (drafted, accepted) in enumerate(zip(drafted_by_depth, accepted_by_depth)):
            self.drafted_by_position[position] += drafted
            self.accepted_by_position[position] += accepted
        self.nodes.merge(run.nodes or _chain_nodes(run.rounds))


def _chain_nodes(rounds: list[tuple[int, int]]) -> NodeAcceptance:
    """Chains' drafting rounds counted by node place (Hugging Face's traced rounds)."""
    nodes = NodeAcceptance()
    for drafted, accepted in rounds:
        if drafted:
            nodes.add_chain(drafted, accepted)
    return nodes


def _by_position(rounds: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Chains' rounds drafted / kept at each draft position."""
    longest = max((drafted for drafted, _ in rounds), default=0)
    drafted_at, accepted_at = [0] * longest, [0] * longest
    for drafted, accepted in rounds:
        for position in range(drafted):
            drafted_at[position] += 1
        for position in range(accepted):
            accepted_at[position] += 1
    return drafted_at, accepted_at
