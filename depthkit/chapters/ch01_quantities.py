"""Chapter 01's named quantities: the layers it reads, the headline names (chapter 07
and the verdicts look rows up by them), the paper's reference rows, and how a
difference in percentage points is written."""

from __future__ import annotations

import numpy as np
import pandas as pd

from depthkit.analyses import frequency
from depthkit.chapters import PAPER_COLUMNS
from depthkit.stats import narrate

TOP = frequency.BUCKETS[0]
# The embedding row (no block has run) and the residual after block 0, in both layer conventions.
EMBEDDING_LAYER = 0
FIRST_LAYER = 1
PAPER_SOURCE = "paper (reference)"
NAN = float("nan")

Q_PEAK = "Top-10 share of the lens top-1 peaks at"
Q_L0 = "layer-0 (embedding) top-1 in Top 1-10"
Q_L1 = "layer-1 top-1 in Top 1-10"
Q_FINAL = "final top-1 in Top 1-10"
Q_FLIP = "layer-1 Top 1-10 guesses later overturned"
Q_EARLY_FLIP = "early high-frequency guesses later overturned"

# Shares are fractions; a bound alone ("> 75 %") is a range lo..hi with no value.
PAPER = pd.DataFrame(
    [
        (Q_L1, "Pythia-6.9B", NAN, 0.75, 1.0),
        (Q_FINAL, "Pythia-6.9B", 0.33, NAN, NAN),
        (Q_FLIP, "Pythia-6.9B", 0.80, NAN, NAN),
        (Q_EARLY_FLIP, "all four models", NAN, 0.70, 1.0),
        ("corpus share of the Top-10 tokens", "Llama-2 tokenizer, Wikipedia", 0.23, NAN, NAN),
        ("corpus share of the Top-100 tokens", "Llama-2 tokenizer, Wikipedia", 0.47, NAN, NAN),
        ("corpus share of the Top-1000 tokens", "Llama-2 tokenizer, Wikipedia", 0.69, NAN, NAN),
    ],
    columns=PAPER_COLUMNS,
)
# How the headline table words the paper's rows (the paper gives bounds, not intervals).
_PAPER_TEXT = {
    Q_L1: ("Pythia-6.9B", "> 75 %"),
    Q_FINAL: ("Pythia-6.9B", "≈ 33 %"),
    Q_EARLY_FLIP: ("all four models", "> 70 % (≈ 80 % Pythia layer 1)"),
}


def _pp(diff: float, lo: float, hi: float) -> str:
    """A difference in percentage points with its interval, signed as
    :func:`depthkit.stats.narrate.difference` writes it ("+3.1 pp (95 % CI -1.0 to +7.2)")."""
    if not np.isfinite(diff):
        return "—"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{diff:+.1f} pp ({narrate.NO_INTERVAL})"
    return f"{diff:+.1f} pp ({narrate.interval(lo, hi, digits=1)})"
