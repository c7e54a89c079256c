"""What the reports record about the machine a measurement ran on."""

from __future__ import annotations

import os


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the platform has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # not on every platform
        return None
