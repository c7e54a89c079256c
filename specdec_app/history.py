"""The session's history of replies: a row per reply (the speedups it showed, against which plain
rate), the table, and its CSV, every cell safe to open in a spreadsheet. Pure functions and a
small class over plain values, like speedup.py, whose rates and speedups the rows hold."""

from __future__ import annotations

import atexit
import csv
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence

import pandas as pd

from .speedup import SIDE_BY_SIDE, BaselineRate, decode_rate, speedup

# The first eleven are the columns of old CSVs, kept; "speedup" is the decode-phase figure the
# panel showed ("Speedup now"), over "vs plain tok/s", a plain decode rate.
HISTORY_COLUMNS = ["#", "prompt", "mode", "drafter", "tokens", "acceptance", "tokens per target forward",
                   "tokens/s", "speedup", "vs plain tok/s", "baseline from",
                   "TTFT s", "decode tok/s", "decode speedup", "end-to-end speedup"]


def history_row(number: int, prompt: str, mode: str, drafter: str, stats: Mapping,
                rate: BaselineRate | None, base: Mapping | None = None) -> dict:
    """One reply's row. acceptance and speedups are empty where they mean nothing (a baseline
    reply drafts nothing; no comparable plain rate was measured). `base`: the baseline half's
    stats in side by side, the only run that gives an end-to-end speedup (both halves read the
    same prompt alike)."""
    if base and drafter != "none":  # side by side: its own baseline half, not the book's rate
        rate = BaselineRate(decode_rate(base), SIDE_BY_SIDE, 0.0, 0)
    value = speedup(decode_rate(stats), rate) if drafter != "none" else None
    end_to_end = None
    if base and drafter != "none" and base.get("tokens_per_second", 0.0) > 0:
        end_to_end = stats.get("tokens_per_second", 0.0) / base["tokens_per_second"]
    drafted = stats.get("drafted_tokens", 0)
    text = " ".join(prompt.split())
    ttft = stats.get("ttft_s")
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
        "TTFT s": "" if ttft is None else round(ttft, 3),
        "decode tok/s": round(decode_rate(stats), 1) if decode_rate(stats) > 0 else "",
        "decode speedup": "" if value is None else round(value, 2),
        "end-to-end speedup": "" if end_to_end is None else round(end_to_end, 2),
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
