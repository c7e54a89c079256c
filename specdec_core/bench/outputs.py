"""How every bench command writes its files: JSON indented, UTF-8, non-ASCII kept readable."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_text(path: Path, text: str) -> None:
    """A markdown table or report, ending in one newline."""
    path.write_text(text.rstrip("\n") + "\n", encoding="utf-8")
