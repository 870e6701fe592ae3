"""Chapter 04 (part of speech and depth): headline quantities and the paper's
reference rows."""

from __future__ import annotations

import pandas as pd

from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS

# The paper's main figure: rank-1 onset near layer 5 for function words and near
# layer 20 for content words, of 32 blocks.
PAPER = pd.DataFrame(
    [
        ("rank-1 onset, function words", "main figure (32 blocks)", 5 / 32, float("nan"), float("nan")),
        ("rank-1 onset, content words", "main figure (32 blocks)", 20 / 32, float("nan"), float("nan")),
    ],
    columns=PAPER_COLUMNS,
)


def headlines(run) -> pd.DataFrame:
    """Mean rank-1 onset layer of function and content words (table ``k1_by_class``)."""
    k1 = run["k1_by_class"]
    out = pd.DataFrame(
        {
            "quantity": "rank-1 onset, " + k1["word_class"].astype(str) + " words",
            "value": k1["estimate"].astype(float),
            "lo": k1["lo"].astype(float),
            "hi": k1["hi"].astype(float),
            "n": k1["n"].astype(float) if "n" in k1 else float("nan"),
            "scale": "layer",
        }
    )
    return out[HEADLINE_COLUMNS]
