"""The live speedup of the chat app: which plain-decoding rate a reply is compared with, the
theory beside it, the race chart's data and the session's history of replies.

Pure functions and small classes over plain values (stat dicts, token sources, times), no
gradio and no models, so they are unit-tested without a server. The app measures;
this module chooses, labels and formats.

Where the plain-decoding rate comes from, best first (`BaselineBook.choose`):
1. the latest measured baseline for the preset (a baseline reply, or the baseline half of
   side by side) whose prompt was of a comparable length;
2. the engine's own plain steps: the policy times every target forward by size, so a round
   that decodes plainly measures a plain step directly (1 / its time is a plain rate);
3. a short plain-decoding calibration run when the models load.
Every figure shown was measured; with none measured the panel says so.
"""

from __future__ import annotations

import atexit
import csv
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from specdec_core.theory import predicted_speedup

# Where a plain-decoding rate was measured (shown in the label: "measured in side-by-side").
SIDE_BY_SIDE = "side-by-side"
BASELINE_REPLY = "a baseline reply"
PLAIN_STEPS = "plain steps"
CALIBRATION = "calibration"
REPLY_SOURCES = (SIDE_BY_SIDE, BASELINE_REPLY)  # a whole plain reply, the best comparison

# Attention makes a step dearer as the context grows, so a rate measured on a much shorter or
# longer prompt is not the same target's speed: within a factor of 2, or 256 tokens, it is.
COMPARABLE_FACTOR = 2.0
COMPARABLE_TOKENS = 256
MIN_TOKENS = 4  # fewer tokens than this time the prompt read more than the decoding

# Race chart series; the measured-rate line is drawn dashed (the app's CSS matches its name).
SPECULATIVE_RUN = "speculative"
BASELINE_RUN = "baseline"
MEASURED_RATE_RUN = "baseline (measured rate)"
RACE_COLOURS = {SPECULATIVE_RUN: "#16a34a", BASELINE_RUN: "#6b7280", MEASURED_RATE_RUN: "#6b7280"}
RACE_DASHED_CSS = ('<style>#race-chart path[aria-roledescription="line mark"]'
                   f'[aria-label$="run: {MEASURED_RATE_RUN}"]{{stroke-dasharray:6 4}}</style>')


@dataclass(frozen=True)
class BaselineRate:
    """A measured plain-decoding rate of one preset on this machine."""

    tokens_per_second: float
    source: str  # SIDE_BY_SIDE | BASELINE_REPLY | PLAIN_STEPS | CALIBRATION
    measured_at: float  # time.time() when it was measured
    context_tokens: int  # prompt length it was measured at
    detail: str = ""  # how, e.g. "24 tokens in 1.04 s" or "a plain step 41 ms"

    @classmethod
    def of_reply(cls, stats: Mapping, source: str, context_tokens: int, now: float,
                 detail: str = "") -> BaselineRate | None:
        """The rate of a finished plain reply (engine stats); None if it was too short to time."""
        tokens, seconds = stats.get("new_tokens", 0), stats.get("wall_s", 0.0)
        if tokens < MIN_TOKENS or seconds <= 0:
            return None
        return cls(tokens / seconds, source, now, context_tokens, detail or f"{tokens} tokens in {seconds:.2f} s")

    @classmethod
    def of_plain_step(cls, step_s: float | None, context_tokens: int, now: float) -> BaselineRate | None:
        """The rate one measured plain target step implies (None: not measured)."""
        if not step_s or step_s <= 0:
            return None
        return cls(1.0 / step_s, PLAIN_STEPS, now, context_tokens, f"a plain step {step_s * 1e3:.0f} ms")


def comparable(a: int, b: int) -> bool:
    """Whether prompts of a and b tokens decode at about the same speed (see COMPARABLE_*)."""
    low, high = sorted((max(a, 1), max(b, 1)))
    return high - low <= COMPARABLE_TOKENS or high <= COMPARABLE_FACTOR * low


class BaselineBook:
    """The latest measured plain-decoding rates of each preset, shared by every session of a
    server (one machine, one set of models): one entry per preset and source kind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replies: dict[str, list[BaselineRate]] = {}  # a few latest, newest last
        self._latest: dict[tuple[str, str], BaselineRate] = {}  # (preset, PLAIN_STEPS | CALIBRATION)

    def record(self, preset: str, rate: BaselineRate | None) -> None:
        if rate is None:
            return
        with self._lock:
            if rate.source in REPLY_SOURCES:
                self._replies[preset] = [*self._replies.get(preset, [])[-15:], rate]
            else:
                self._latest[(preset, rate.source)] = rate

    def has(self, preset: str, source: str) -> bool:
        with self._lock:
            return (preset, source) in self._latest

    def choose(self, preset: str, context_tokens: int, live_plain: BaselineRate | None = None) -> BaselineRate | None:
        """The rate to compare a reply with: see the module docstring for the order.

        live_plain: a plain step measured during the running reply (fresher than any recorded).
        """
        with self._lock:
            for rate in reversed(self._replies.get(preset, [])):
                if comparable(rate.context_tokens, context_tokens):
                    return rate
            if live_plain is not None:
                return live_plain
            return self._latest.get((preset, PLAIN_STEPS)) or self._latest.get((preset, CALIBRATION))


# ---------------------------------------------------------------- labels


def age_text(seconds: float) -> str:
    """'just now', '40 s ago', '2 min ago', '3 h ago'."""
    if seconds < 10:
        return "just now"
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min ago"
    return f"{seconds // 3600:.0f} h ago"


_WHERE = {
    SIDE_BY_SIDE: "measured in side-by-side",
    BASELINE_REPLY: "measured in a baseline reply",
    PLAIN_STEPS: "measured from the engine's plain steps",
    CALIBRATION: "measured by a calibration at load",
}


def baseline_label(rate: BaselineRate | None, now: float) -> str:
    """'vs plain decoding 23.1 tok/s, measured in side-by-side 2 min ago (96 tokens in 4.16 s)'."""
    if rate is None:
        return "no plain-decoding rate measured yet: tick Baseline or side by side for one reply"
    detail = f" ({rate.detail})" if rate.detail else ""
    return (f"vs plain decoding {rate.tokens_per_second:.1f} tok/s, {_WHERE[rate.source]} "
            f"{age_text(now - rate.measured_at)}{detail}")


# ---------------------------------------------------------------- this reply's rounds and theory


@dataclass(frozen=True)
class RoundCounts:
    """A fold over one reply's token sources: every round ends with one target token, its
    `target` (plain), `resampled` (a draft rejected) or `bonus` (every draft kept)."""

    rounds: int
    plain_rounds: int
    rejections: int
    accepted: int

    @classmethod
    def of(cls, sources: Iterable[str]) -> RoundCounts:
        counts = {"draft": 0, "target": 0, "resampled": 0, "bonus": 0}
        for source in sources:
            counts[source] += 1
        return cls(rounds=counts["target"] + counts["resampled"] + counts["bonus"],
                   plain_rounds=counts["target"], rejections=counts["resampled"], accepted=counts["draft"])


@dataclass(frozen=True)
class Prediction:
    """Leviathan et al.'s speedup from this reply's acceptance and step costs."""

    a: float  # per-token acceptance: kept drafts / (kept drafts + rejections)
    g: float  # drafts per drafting round
    c: float  # drafting cost per token, in target steps
    v: float  # verify cost over 1 + g tokens, in target steps
    share: float  # share of rounds that drafted
    speedup: float


def predict(counts: RoundCounts, stats: Mapping, step_s: Callable[[int], float | None]) -> Prediction | None:
    """The prediction for a reply, or None before a drafting round or a measured plain step.

    step_s(n): the measured time of a target forward over n tokens (the engine's policy).
    """
    drafting = counts.rounds - counts.plain_rounds
    drafted = stats.get("drafted_tokens", 0)
    step = step_s(1)
    if drafting <= 0 or drafted <= 0 or not step:
        return None
    g = drafted / drafting
    verify = step_s(round(g) + 1)
    if not verify:
        return None
    tried = counts.accepted + counts.rejections
    a = counts.accepted / tried if tried else 0.0
    c = (stats.get("draft_s", 0.0) / drafted) / step
    v = verify / step
    share = drafting / counts.rounds
    return Prediction(a, g, c, v, share, predicted_speedup(a, g, c, v, share))


# ---------------------------------------------------------------- the live figure


def speedup(tokens_per_second: float, rate: BaselineRate | None) -> float | None:
    if rate is None or rate.tokens_per_second <= 0 or tokens_per_second <= 0:
        return None
    return tokens_per_second / rate.tokens_per_second


def live_markdown(stats: Mapping | None, rate: BaselineRate | None, prediction: Prediction | None,
                  now: float, baseline_reply: bool = False) -> str:
    """The #speedup-live panel: the speedup so far, where its baseline came from, the theory."""
    if not stats:
        return "**Speedup now: –** · send a message: each speculative reply shows its speedup here"
    tps = stats.get("tokens_per_second", 0.0)
    if baseline_reply:
        return (f"**Baseline reply** · plain decoding at {tps:.1f} tok/s: later speculative replies "
                "compare with this rate")
    value = speedup(tps, rate)
    figure = "–" if value is None else f"{value:.2f}×"
    lines = [f"**Speedup now: {figure}** · {tps:.1f} tok/s {baseline_label(rate, now)}"]
    if prediction is None:
        lines.append("Predicted (Leviathan et al.): – until a round drafts")
    else:
        efficiency = "" if value is None else f" · efficiency {value / prediction.speedup:.0%} (measured / predicted)"
        lines.append(f"Predicted (Leviathan et al.): {prediction.speedup:.2f}× from a = {prediction.a:.2f}, "
                     f"g = {prediction.g:.1f}, c = {prediction.c:.2f}, v = {prediction.v:.2f}, "
                     f"{prediction.share:.0%} of rounds drafting{efficiency}")
    return "\n\n".join(lines)


def side_by_side_so_far(spec: Mapping, base: Mapping) -> str:
    """The #speedup pane while the speculative half streams against the finished baseline."""
    spec_tps, base_tps = spec.get("tokens_per_second", 0.0), base.get("tokens_per_second", 0.0)
    if base_tps <= 0:
        return "Speedup so far: – (the baseline produced no tokens)"
    return (f"**Speedup so far: {spec_tps / base_tps:.2f}×** (speculative {spec_tps:.1f} tok/s vs "
            f"baseline {base_tps:.1f} tok/s) · generating…")


# ---------------------------------------------------------------- the race chart


def race_point(stats: Mapping) -> tuple[float, int]:
    """(engine seconds, tokens) of a run so far."""
    return float(stats.get("wall_s", 0.0)), int(stats.get("new_tokens", 0))


def race_frame(spec: Sequence[tuple[float, int]], base: Sequence[tuple[float, int]] = (),
               rate: BaselineRate | None = None, spec_run: str = SPECULATIVE_RUN) -> pd.DataFrame:
    """Tokens against seconds for a LinePlot: the reply's curve and the baseline's.

    `base`: a real baseline run (side by side); without one, `rate` draws the measured plain
    rate as a straight line from the origin to the reply's last second (MEASURED_RATE_RUN).
    spec_run: the reply's series name (BASELINE_RUN for a baseline reply). A series with only
    its origin draws nothing.
    """
    # Every series starts at the origin in every frame, used or not: the plot fixes its colours
    # and legend from the series of the first frame it draws, and would leave a new one invisible.
    rows = [(0.0, 0, run) for run in RACE_COLOURS]
    rows += [(s, n, spec_run) for s, n in spec]
    if base:
        rows += [(s, n, BASELINE_RUN) for s, n in base]
    elif rate is not None and spec:
        end = max(s for s, _ in spec)
        rows.append((end, round(rate.tokens_per_second * end), MEASURED_RATE_RUN))
    # Typed even when nearly empty: the plot fixes each axis's scale type from its first value.
    frame = pd.DataFrame(rows, columns=["seconds", "tokens", "run"])
    return frame.astype({"seconds": float, "tokens": int, "run": str})


# ---------------------------------------------------------------- the history of replies

HISTORY_COLUMNS = ["#", "prompt", "mode", "drafter", "tokens", "acceptance", "tokens per target forward",
                   "tokens/s", "speedup", "vs plain tok/s", "baseline from"]


def history_row(number: int, prompt: str, mode: str, drafter: str, stats: Mapping,
                rate: BaselineRate | None) -> dict:
    """One reply's row. acceptance and speedup are empty where they mean nothing (a baseline
    reply drafts nothing; no plain rate was measured)."""
    value = speedup(stats.get("tokens_per_second", 0.0), rate) if drafter != "none" else None
    drafted = stats.get("drafted_tokens", 0)
    text = " ".join(prompt.split())
    return {
        "#": number,
        "prompt": text if len(text) <= 40 else text[:39] + "…",
        "mode": mode,
        "drafter": drafter,
        "tokens": int(stats.get("new_tokens", 0)),
        "acceptance": round(stats.get("acceptance_rate", 0.0), 3) if drafted else "",
        "tokens per target forward": round(stats.get("tokens_per_target_forward", 0.0), 2),
        "tokens/s": round(stats.get("tokens_per_second", 0.0), 1),
        "speedup": "" if value is None else round(value, 2),
        "vs plain tok/s": "" if value is None else round(rate.tokens_per_second, 1),
        "baseline from": "" if value is None else rate.source,
    }


def history_frame(rows: Sequence[Mapping]) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=HISTORY_COLUMNS)


def write_history_csv(rows: Sequence[Mapping], path: str) -> str:
    """The history as CSV at `path` (returned), one row per reply, the table's columns, every
    cell safe to open in a spreadsheet."""
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=HISTORY_COLUMNS)
        writer.writeheader()
        writer.writerows({name: spreadsheet_safe(value) for name, value in row.items()} for row in rows)
    return path


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(cell: object) -> object:
    """A text cell a spreadsheet would run as a formula (a prompt like `=HYPERLINK(...)`) with a
    leading `'`, OWASP's rule for CSV injection; numbers and other text as they are. Applied to
    the cell as written, after any whitespace normalisation, which could uncover a formula."""
    if isinstance(cell, str) and cell.startswith(FORMULA_STARTS):
        return "'" + cell
    return cell


class ReplyHistory:
    """One browser session's replies (kept in a gr.State, changed in place), and their CSV."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self._folder: str | None = None

    def add(self, row: dict) -> None:
        self.rows.append(row)

    def csv_file(self) -> str:
        """The history written as reply-history.csv in this session's own temporary folder."""
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="session-", dir=_history_root())
        return write_history_csv(self.rows, os.path.join(self._folder, "reply-history.csv"))

    def remove_files(self) -> None:
        """Delete this session's folder (its session ended; gradio served its own copy)."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


_root_lock = threading.Lock()
_root: list[str] = []  # the process's folder of session folders, once made


def _history_root() -> str:
    """One folder per process that holds every session's folder, removed when the process
    exits: sessions that never end cleanly (evicted, the server stopped) leave nothing behind."""
    with _root_lock:
        if not _root:
            _root.append(tempfile.mkdtemp(prefix="specdec-history-"))
            atexit.register(shutil.rmtree, _root[0], ignore_errors=True)
        return _root[0]


class Throttle:
    """True at most once per `interval_s` (the race chart redraws less often than the text)."""

    def __init__(self, interval_s: float, clock: Callable[[], float]) -> None:
        self.interval_s, self._clock, self._last = interval_s, clock, None

    def due(self) -> bool:
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True
