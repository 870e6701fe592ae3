"""Chapter 04's claim (word classes): function words reach rank 1 at fewer layers
than content words, under both frequency controls. Its test, the paper's
reference, and the class gap derived from the chapter's saved run (with the lens
agreement from chapter 00's prompts, as chapter 04 saves no layer-wise ranks)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from depthkit.core.results import Run
from depthkit.verdicts.quantities import Q_ADJUSTED, Q_AGREE, Q_CLASS_GAP, Q_CLASSES, Q_MATCHED, _boot, _paper, _share
from depthkit.verdicts.records import Check, Evidence, Reference, Stat
from depthkit.verdicts.testability import _check, _lens_gate
from depthkit.verdicts.wording import _above, _ci, _has_interval


def _function_first(ev: Evidence, ref: Reference) -> list[Check]:
    matched, adjusted = ev.get("04", Q_MATCHED), ev.get("04", Q_ADJUSTED)
    comparable = ev.get("04", Q_CLASSES)
    gate = None if comparable is None or comparable.value else "the run could not compare the word classes (see chapter 04)"

    def score(s: Stat) -> tuple[int, str]:
        gap = f"content minus function onset {_ci(s)} of the depth"
        if not _above(s.lo, 0.0):
            return 0, f"{gap}: no clear difference"
        controls = [c for c in (matched, adjusted) if c is not None]
        if len(controls) == 2 and all(_has_interval(c) and _above(c.lo, 0.0) for c in controls):
            return 2, f"{gap}, and both frequency controls agree"
        return 1, f"{gap}, but the frequency controls ({_ci(matched)}, {_ci(adjusted)}) do not both confirm it"

    return [_check("word-class gap", ev.get("04", Q_CLASS_GAP), [gate, _lens_gate(ev, "04")], score)]


def _ref_classes(paper: pd.DataFrame) -> Reference:
    f, c = _paper(paper, "rank-1 onset, function words"), _paper(paper, "rank-1 onset, content words")
    gap = c["value"] - f["value"]
    return Reference(gap, f"≈ {gap:.2f} of the depth ({f['value']:.2f} vs {c['value']:.2f}, {f['model']})")


def _ch00_agreement(run: Run, other: Callable[[str], Run | None]) -> list[tuple]:
    """The lens agreement at L−1 on chapter 00's prompts, for the lens chapter 04 ran with."""
    lenses = other("00")
    lens = run.manifest.get("notes", {}).get("lens", run.params.get("lens"))
    if lenses is None or "prompt_metrics" not in lenses.tables:
        return []
    m = lenses["prompt_metrics"]
    m = m[(m["lens"] == lens) & (m["layer"] == int(run.model["n_blocks"]) - 1)]
    return [(Q_AGREE, *_share(m["top1_agreement"].iloc[0] * m["n"].iloc[0], m["n"].iloc[0], run))] if len(m) else []


def _derive_04(run: Run, other: Callable[[str], Run | None]) -> list[tuple]:
    from depthkit.chapters.ch04_pos_onset import rank1

    L = int(run.model["n_blocks"])
    comparable = bool(run.manifest.get("notes", {}).get("class_comparison", len(run["k1_by_class"]) == 2))
    rows: list[tuple] = [(Q_CLASSES, float(comparable), np.nan, np.nan, np.nan), *_ch00_agreement(run, other)]
    if not comparable:
        return rows
    gap = rank1(run["onsets"], L, compare=True, **_boot(run))["gap"]
    rows.append((Q_CLASS_GAP, gap["diff"] / L, gap["lo"] / L, gap["hi"] / L, min(gap["n_a"], gap["n_b"])))
    for q, name, cols in ((Q_MATCHED, "k1_matched_frequency", ("diff", -1)), (Q_ADJUSTED, "k1_frequency_adjusted", ("estimate", 0))):
        if name in run.tables:
            r = run[name].iloc[cols[1]]
            rows.append((q, r[cols[0]] / L, r["lo"] / L, r["hi"] / L, np.nan))
    return rows
