"""Where depthkit keeps what it computes once and reuses: tuned lenses, token
frequency tables, part-of-speech datasets, the chart JavaScript."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$DEPTHKIT_CACHE`` (default ``~/.cache/depthkit``), joined with ``parts``."""
    root = Path(os.environ.get("DEPTHKIT_CACHE") or Path.home() / ".cache" / "depthkit").expanduser()
    return root.joinpath(*parts)
