"""Chapter 03's claim (fact recall): the first token of a multi-token answer needs
more depth than the later ones. Its test, the paper's reference, and the paired
token differences derived from the chapter's saved run."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from depthkit.core.results import Run
from depthkit.verdicts.quantities import Q_AGREE, Q_TOKEN_GAP, _boot, _paper, _share
from depthkit.verdicts.records import Check, Evidence, Reference, Stat
from depthkit.verdicts.testability import _check, _lens_gate
from depthkit.verdicts.wording import _above, _ci


def _first_token_deepest(ev: Evidence, ref: Reference) -> list[Check]:
    gate = _lens_gate(ev, "03")

    def check(t: int) -> Check:
        def score(s: Stat) -> tuple[int, str]:
            later = _above(s.lo, 0.0)
            return int(later) * 2, f"token 1 − token {t} {_ci(s)}" + ("" if later else ": no clear difference")

        return _check(f"token 1 − token {t}", ev.get("03", Q_TOKEN_GAP.format(t=t)), [gate], score)

    return [check(t) for t in (2, 3)]


def _ref_tokens(paper: pd.DataFrame) -> Reference:
    v = {t: _paper(paper, f"fact recall rank-1 onset, answer token {t}") for t in (1, 2, 3)}
    d2, d3 = v[1]["value"] - v[2]["value"], v[1]["value"] - v[3]["value"]
    return Reference(d2, f"token 1 − 2 ≈ {d2:.2f}, token 1 − 3 ≈ {d3:.2f} of the depth ({v[1]['model']})")


def _derive_03(run: Run, other: Callable[[str], Run | None]) -> list[tuple]:
    from depthkit.chapters.ch03_fact_recall import token_difference

    L, main = int(run.model["n_blocks"]), run.params.get("dataset")
    r = run["answer_ranks"]
    last = r[(r["layer"] == L - 1) & r["correct"].astype(bool)]
    rows = [(Q_AGREE, *_share((last["rank"] == 1).sum(), len(last), run))] if len(last) else []
    for t in (2, 3):
        d = token_difference(run["onsets"], main, t, 1, n_blocks=L, **_boot(run))  # onsets at L are censored
        rows.append((Q_TOKEN_GAP.format(t=t), d["diff"] / L, d["lo"] / L, d["hi"] / L, d["n"]))
    return rows
