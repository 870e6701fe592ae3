"""The book's verdicts on the paper's claims, with the rules declared once, before
any result is read.

Each :class:`Rule` names a claim, the statistic that tests it (a chapter's headline
row or a quantity computed here from the chapter's saved tables), the paper's value
it is compared with (from the chapters' reference rows, :func:`paper_reference`)
and its test. A test reads one model's :class:`Evidence` and returns one
:class:`Check` per unit it measures (the run, a task, a patching direction): a score
(2: as the paper says, 1: the direction only, 0: not shown) or, where the claim
cannot be tested on this model, none and why. A finding counts as shown only where
its interval excludes the comparison value (zero for a difference); a statistic
without an interval shows nothing.

Outcomes: ``reproduced`` (every testable unit scores 2), ``partly`` (some unit
scores at least 1), ``not reproduced`` (none does), ``not testable`` (no unit is
testable). Units are testable when they have :data:`depthkit.stats.MIN_N` units of
resampling and an interval; where the statistic reads the lens, the lens's top-1
agrees with the model at layer L−1 on at least :data:`LENS_FLOOR` of the chapter's
own prompts; and for a multiple-choice task, accuracy's interval clears the gold
majority baseline and no one answer is given to more than :data:`ONE_ANSWER_MAX` of
the prompts.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from depthkit.chapters import CHAPTERS, paper_reference, run_headlines
from depthkit.chapters.ch01_guess_then_refine import Q_EARLY_FLIP, Q_FINAL, Q_FLIP, Q_L1
from depthkit.chapters.ch02_mcq_collection_vs_reasoning import LENS_FLOOR, ONE_ANSWER_MAX
from depthkit.core import results as saved
from depthkit.core.files import atomic_write
from depthkit.core.results import ResultsError, Run, list_runs, load_run
from depthkit.stats import MIN_N, bootstrap_ci, unit_mean

OUTCOMES = ("reproduced", "partly", "not reproduced", "not testable")
# The testability thresholds chapter 02 states in its own text (LENS_FLOOR: lens
# agreement with the model at L−1; ONE_ANSWER_MAX: share of prompts given one answer),
# so a chapter and its verdict can never disagree on them.
# Runs of the same models under another lens, convention or seed, one results root
# each: results/_robustness/<variant>/<model>/<chapter>/.
ROBUSTNESS_DIR = "_robustness"
# Relative to book/: findings.md includes it with {include} _generated/findings.md.
FINDINGS_PAGE = Path("_generated") / "findings.md"
VARIANT_PARAMS = ("lens", "convention", "seed", "lens_budget", "dtype")

Q_AGREE = "lens top-1 agreement at layer L−1"
Q_ACCURACY, Q_BASELINE, Q_ONE_ANSWER = "accuracy", "majority baseline", "one-answer share"
Q_ORDER = "answer settled minus options collected"
Q_PATCH_GAP = "patching transition minus collection layer"
Q_TOKEN_GAP = "token 1 minus token {t} rank-1 onset"
Q_CLASS_GAP = "content minus function rank-1 onset"
Q_MATCHED, Q_ADJUSTED = Q_CLASS_GAP + ", frequency-matched", Q_CLASS_GAP + ", frequency-adjusted"
Q_CLASSES = "function and content words comparable"
Q_SLOPE = "slope change at ℓ*"
Q_EDGE = "ℓ* blocks from the edge of the fit range"
Q_DEPTH_GAP = "content minus function onset depth d1/L"
Q_CLASS_TOKENS = "{c}-word tokens"
EVIDENCE_COLUMNS = ["chapter", "quantity", "value", "lo", "hi", "n"]


class Stat(NamedTuple):
    value: float
    lo: float
    hi: float
    n: float


class Reference(NamedTuple):
    """The paper's comparison value (NaN where the claim has none) and its wording."""

    value: float
    text: str


@dataclass(frozen=True)
class Check:
    """One measured unit of a rule: its statistic and score (None: not testable)."""

    label: str
    stat: Stat | None
    score: int | None
    why: str


@dataclass(frozen=True)
class Verdict:
    rule: str
    model: str
    outcome: str
    checks: tuple[Check, ...]
    reason: str


class Evidence:
    """One model's rows ``[chapter, quantity, value, lo, hi, n]``: the chapters'
    headlines (layers as ℓ/L) and the quantities :func:`evidence` derives."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame[EVIDENCE_COLUMNS].reset_index(drop=True)

    def get(self, chapter: str, quantity: str) -> Stat | None:
        rows = self.frame[(self.frame["chapter"] == chapter) & (self.frame["quantity"] == quantity)]
        return None if rows.empty else Stat(*(float(rows.iloc[0][c]) for c in ("value", "lo", "hi", "n")))

    def labels(self, chapter: str, quantity: str) -> list[str]:
        """The ``x`` of every row ``"<quantity> (x)"`` of ``chapter``, in order."""
        q = self.frame.loc[self.frame["chapter"] == chapter, "quantity"]
        found = q[q.str.startswith(quantity + " (") & q.str.endswith(")")]
        return [s[len(quantity) + 2 : -1] for s in found]

    def has(self, chapter: str) -> bool:
        return bool((self.frame["chapter"] == chapter).any())


Test = Callable[[Evidence, Reference], list[Check]]


@dataclass(frozen=True)
class Rule:
    name: str
    chapter: str
    claim: str
    statistic: str
    conditions: str
    reference: Callable[[pd.DataFrame], Reference]
    test: Test
    # Headline quantities the rule reads ("{unit}": a check's task or direction):
    # chapter 07 marks them with the caveats of checks that fall short.
    reads: tuple[str, ...] = ()


# --------------------------------------------------------------------------- wording


def _ci(s: Stat | None, pct: bool = False) -> str:
    """A value with its interval; an interval whose ends are equal is not shown as
    one (every resample gave the same grid value: it says so instead)."""
    if s is None or not math.isfinite(s.value):
        return "—"
    f = (lambda v: f"{v:.0%}") if pct else (lambda v: f"{v:.2f}")
    if not (math.isfinite(s.lo) and math.isfinite(s.hi)):
        return f(s.value)
    if f(s.lo) == f(s.hi):
        return f"{f(s.value)} (every resample)"
    return f"{f(s.value)} [{f(s.lo)}, {f(s.hi)}]"


def _layer_at(s: Stat | None) -> str:
    """A layer as ℓ/L, where ℓ/L = 1 (the output row) is censoring, not a depth."""
    if s is not None and math.isfinite(s.value) and s.value >= 1:
        share = "" if not _has_interval(s) or s.lo >= 1 else f" (95 % CI from ℓ/L {s.lo:.2f})"
        return f"the output, not before{share}"
    return f"ℓ/L {_ci(s)}"


def _has_interval(s: Stat) -> bool:
    return math.isfinite(s.lo) and math.isfinite(s.hi)


def _untestable(s: Stat | None, what: str) -> str | None:
    """Why ``s`` cannot carry a finding: not measured, too few units, no interval."""
    if s is None or not math.isfinite(s.value):
        return f"{what} not measured"
    if not s.n >= MIN_N:
        return f"{what} from {s.n:.0f} units, fewer than {MIN_N}"
    if not _has_interval(s):
        return f"{what} has no interval"
    return None


def _lens_gate(ev: Evidence, chapter: str, suffix: str = "") -> str | None:
    a = ev.get(chapter, Q_AGREE + suffix)
    if a is not None and a.value < LENS_FLOOR:
        return f"the lens agrees with the model at layer L−1 on {a.value:.0%} of prompts, below the floor of {LENS_FLOOR:.0%}"
    return None


def _task_gate(ev: Evidence, task: str) -> str | None:
    """Why a multiple-choice task cannot test a claim about when its answer forms."""
    acc, base, one = (ev.get("02", f"{q} ({task})") for q in (Q_ACCURACY, Q_BASELINE, Q_ONE_ANSWER))
    if acc is None or base is None or not (math.isfinite(acc.lo) and acc.lo > base.value):
        return f"accuracy {_ci(acc, True)} does not clear the majority baseline of {_ci(base, True)}"
    if one is not None and one.value > ONE_ANSWER_MAX:
        return f"one answer to {one.value:.0%} of prompts (more than {ONE_ANSWER_MAX:.0%})"
    return _lens_gate(ev, "02", f" ({task})")


def _check(label: str, s: Stat | None, gates: Sequence[str | None], score: Callable[[Stat], tuple[int, str]]) -> Check:
    why = next((g for g in gates if g), None) or _untestable(s, label)
    if why or s is None:
        return Check(label, s, None, why or f"{label} not measured")
    points, text = score(s)
    return Check(label, s, points, text)


# --------------------------------------------------------------------------- tests


def _frequent_early(ev: Evidence, ref: Reference) -> list[Check]:
    final = ev.get("01", Q_FINAL)

    def score(s: Stat) -> tuple[int, str]:
        where = f"layer-1 Top-10 share {_ci(s, True)}"
        if s.lo > ref.value:
            return 2, f"{where} lies above the paper's {ref.value:.0%}"
        if final is not None and _has_interval(final) and s.lo > final.hi:
            return 1, f"{where} lies above the output's {_ci(final, True)} but not above the paper's {ref.value:.0%}"
        return 0, f"{where} is not clearly above the output's {_ci(final, True)}"

    return [_check("layer-1 Top-10 share", ev.get("01", Q_L1), [_lens_gate(ev, "01")], score)]


def _overturned(ev: Evidence, ref: Reference) -> list[Check]:
    def score(s: Stat) -> tuple[int, str]:
        where = f"{_ci(s, True)} of layer-1 Top-10 guesses are overturned"
        if s.lo > ref.value:
            return 2, f"{where}, above the paper's {ref.value:.0%}"
        if s.lo > 0.5:
            return 1, f"{where}: most, but not clearly above the paper's {ref.value:.0%}"
        return 0, f"{where}: not clearly most of them"

    return [_check("layer-1 flip rate", ev.get("01", Q_FLIP), [_lens_gate(ev, "01")], score)]


def _function_first(ev: Evidence, ref: Reference) -> list[Check]:
    matched, adjusted = ev.get("04", Q_MATCHED), ev.get("04", Q_ADJUSTED)
    comparable = ev.get("04", Q_CLASSES)
    gate = None if comparable is None or comparable.value else "the run could not compare the word classes (see chapter 04)"

    def score(s: Stat) -> tuple[int, str]:
        gap = f"content minus function onset {_ci(s)} of the depth"
        if not s.lo > 0:
            return 0, f"{gap}: no clear difference"
        controls = [c for c in (matched, adjusted) if c is not None]
        if len(controls) == 2 and all(_has_interval(c) and c.lo > 0 for c in controls):
            return 2, f"{gap}, and both frequency controls agree"
        return 1, f"{gap}, but the frequency controls ({_ci(matched)}, {_ci(adjusted)}) do not both confirm it"

    return [_check("word-class gap", ev.get("04", Q_CLASS_GAP), [gate, _lens_gate(ev, "04")], score)]


def _first_token_deepest(ev: Evidence, ref: Reference) -> list[Check]:
    gate = _lens_gate(ev, "03")

    def check(t: int) -> Check:
        def score(s: Stat) -> tuple[int, str]:
            later = s.lo > 0
            return int(later) * 2, f"token 1 − token {t} {_ci(s)}" + ("" if later else ": no clear difference")

        return _check(f"token 1 − token {t}", ev.get("03", Q_TOKEN_GAP.format(t=t)), [gate], score)

    return [check(t) for t in (2, 3)]


def _tasks(ev: Evidence) -> list[str]:
    return ev.labels("02", "MCQ options collected")


def _collected_first(ev: Evidence, ref: Reference) -> list[Check]:
    def check(task: str) -> Check:
        def score(s: Stat) -> tuple[int, str]:
            first = s.hi <= ref.value
            return int(first) * 2, f"{task}: collected at {_layer_at(s)}" + ("" if first else ", not clearly in the first half")

        return _check(task, ev.get("02", f"MCQ options collected ({task})"), [_task_gate(ev, task)], score)

    return [check(t) for t in _tasks(ev)]


def _settled_later(ev: Evidence, ref: Reference) -> list[Check]:
    def check(task: str) -> Check:
        settled = ev.get("02", f"MCQ answer settled ({task})")

        def score(s: Stat) -> tuple[int, str]:
            text = f"{task}: settled minus collected {_ci(s)}, settled at {_layer_at(settled)}"
            if not s.lo > 0:
                return 0, text + ": not clearly later"
            second = settled is not None and _has_interval(settled) and settled.lo >= ref.value
            return (2, text) if second else (1, text + ", later but not clearly in the second half")

        return _check(task, ev.get("02", f"{Q_ORDER} ({task})"), [_task_gate(ev, task)], score)

    return [check(t) for t in _tasks(ev)]


def _patching_apart(ev: Evidence, ref: Reference) -> list[Check]:
    def check(direction: str) -> Check:
        def score(s: Stat) -> tuple[int, str]:
            apart = s.lo > 0 or s.hi < 0
            return int(apart) * 2, f"{direction}: transition minus collection {_ci(s)}" + ("" if apart else ": no clear difference")

        target = direction.split(" → ")[-1]
        return _check(direction, ev.get("02", f"{Q_PATCH_GAP} ({direction})"), [_lens_gate(ev, "02", f" ({target})")], score)

    return [check(d) for d in ev.labels("02", Q_PATCH_GAP)]


def _phase_change(ev: Evidence, ref: Reference) -> list[Check]:
    edge = ev.get("05", Q_EDGE)

    def score(s: Stat) -> tuple[int, str]:
        text = f"slope change at ℓ* {_ci(s)}"
        if not (s.lo > 0 or s.hi < 0):
            return 0, text + ": one line fits as well as two segments"
        if edge is None or edge.value <= 0:
            return 0, text + ", but ℓ* sits on the edge of the fit range"
        if edge.value <= 1:
            return 1, text + ", ℓ* one block from the edge of the fit range"
        return 2, text + ", ℓ* interior"

    return [_check("phase change", ev.get("05", Q_SLOPE), [], score)]


def _depth_gap(ev: Evidence, ref: Reference) -> list[Check]:
    counts = {c: ev.get("06", Q_CLASS_TOKENS.format(c=c)) for c in ("function", "content")}
    few = [c for c, s in counts.items() if s is None or s.value < MIN_N]
    gate = f"fewer than {MIN_N} {' and '.join(few)}-word tokens" if few else None

    def score(s: Stat) -> tuple[int, str]:
        later = s.lo > 0
        return int(later) * 2, f"content minus function d1/L {_ci(s)}" + ("" if later else ": no clear difference")

    return [_check("d1/L gap", ev.get("06", Q_DEPTH_GAP), [gate, _lens_gate(ev, "06")], score)]


# --------------------------------------------------------------------------- references


def _paper(paper: pd.DataFrame, quantity: str) -> pd.Series:
    return paper[paper["quantity"] == quantity].iloc[0]


def _ref_frequent(paper: pd.DataFrame) -> Reference:
    l1, fin = _paper(paper, Q_L1), _paper(paper, Q_FINAL)
    return Reference(l1["lo"], f"> {l1['lo']:.0%} at layer 1, ≈ {fin['value']:.0%} at the output ({l1['model']})")


def _ref_overturned(paper: pd.DataFrame) -> Reference:
    early, l1 = _paper(paper, Q_EARLY_FLIP), _paper(paper, Q_FLIP)
    return Reference(early["lo"], f"> {early['lo']:.0%} ({early['model']}); ≈ {l1['value']:.0%} at layer 1 ({l1['model']})")


def _ref_classes(paper: pd.DataFrame) -> Reference:
    f, c = _paper(paper, "rank-1 onset, function words"), _paper(paper, "rank-1 onset, content words")
    gap = c["value"] - f["value"]
    return Reference(gap, f"≈ {gap:.2f} of the depth ({f['value']:.2f} vs {c['value']:.2f}, {f['model']})")


def _ref_tokens(paper: pd.DataFrame) -> Reference:
    v = {t: _paper(paper, f"fact recall rank-1 onset, answer token {t}") for t in (1, 2, 3)}
    d2, d3 = v[1]["value"] - v[2]["value"], v[1]["value"] - v[3]["value"]
    return Reference(d2, f"token 1 − 2 ≈ {d2:.2f}, token 1 − 3 ≈ {d3:.2f} of the depth ({v[1]['model']})")


def _ref_collected(paper: pd.DataFrame) -> Reference:
    r = _paper(paper, "MCQ options collected")
    return Reference(r["hi"], f"first half (ℓ/L ≤ {r['hi']:.2f}), {r['model']}")


def _ref_settled(paper: pd.DataFrame) -> Reference:
    r = _paper(paper, "MCQ answer settled")
    return Reference(r["lo"], f"after collection, in the second half (ℓ/L ≥ {r['lo']:.2f}), {r['model']}")


def _ref_words(text: str) -> Callable[[pd.DataFrame], Reference]:
    return lambda paper: Reference(math.nan, text)


def _ref_depth_gap(paper: pd.DataFrame) -> Reference:
    return Reference(math.nan, f"book addition; the paper's word-class onset gap {_ref_classes(paper).text}")


_LENS = f"lens top-1 agreement with the model at layer L−1 ≥ {LENS_FLOOR:.0%}"
_TASK = (
    f"per task: accuracy's interval above the gold majority baseline, no answer to more than {ONE_ANSWER_MAX:.0%} "
    f"of prompts, {_LENS}, ≥ {MIN_N} prompts"
)

RULES: tuple[Rule, ...] = (
    Rule("frequent early guesses", "01", "Early layers guess one of the most frequent tokens (guess, then refine)",
         "layer-1 top-1 in Top 1-10 (headline), against the paper's bound and the output's share",
         f"{_LENS} on the chapter's prompts; ≥ {MIN_N} prompts", _ref_frequent, _frequent_early, (Q_L1, Q_FINAL)),
    Rule("early guesses overturned", "01", "Most early high-frequency guesses are overturned by the output",
         "layer-1 Top 1-10 guesses later overturned (headline)",
         f"{_LENS} on the chapter's prompts; ≥ {MIN_N} guesses", _ref_overturned, _overturned, (Q_FLIP,)),
    Rule("function words before content words", "04", "Function words reach rank 1 at fewer layers than content words",
         "content minus function mean rank-1 onset (ℓ/L), with the frequency-matched and frequency-adjusted controls",
         f"the classes comparable in the run; {_LENS} (chapter 00's prompts: chapter 04 saves no layer-wise ranks); "
         f"≥ {MIN_N} examples per class", _ref_classes, _function_first,
         ("rank-1 onset, function words", "rank-1 onset, content words")),
    Rule("first answer token deepest", "03", "The first token of a multi-token answer needs more depth than later ones",
         "token 1 minus token 2 and token 3 rank-1 onset (ℓ/L), paired within correctly predicted answers",
         f"{_LENS} on correctly predicted answer tokens; ≥ {MIN_N} paired answers", _ref_tokens, _first_token_deepest,
         tuple(f"fact recall rank-1 onset, answer token {t}" for t in (1, 2, 3))),
    Rule("options collected first", "02", "Multiple choice: the valid options are gathered in the first half",
         "MCQ options collected (task) (headline, ℓ/L), its interval against the half", _TASK, _ref_collected, _collected_first,
         ("MCQ options collected ({unit})",)),
    Rule("answer chosen later", "02", "Multiple choice: the answer is chosen after the options are collected, in the second half",
         "answer settled minus options collected (task), paired over prompts (ℓ/L), and MCQ answer settled (task)",
         _TASK, _ref_settled, _settled_later, ("MCQ answer settled ({unit})",)),
    Rule("patching apart from the lens", "02", "The patching transition does not line up with the lens's collection layer",
         "patching transition minus the target task's collection layer (direction), ℓ/L",
         f"{_LENS} on the target task's prompts; ≥ {MIN_N} patching pairs",
         _ref_words("they do not line up (Llama-3-8B; no number given)"), _patching_apart, ("patching transition ({unit})",)),
    Rule("residual phase change", "05", "The residual stream changes regime partway through the network",
         "slope change of the two-segment fit at ℓ* and ℓ*'s distance from the fit range's edge",
         f"≥ {MIN_N} passages (no lens involved)",
         _ref_words("book addition (Csordás et al. 2025; Lad et al. 2024): no paper value"), _phase_change),
    Rule("content words deeper in running text", "06", "Content words need more depth than function words in running text",
         "content minus function mean onset depth d1/L over passages",
         f"{_LENS} on the chapter's tokens; ≥ {MIN_N} passages and tokens of each class", _ref_depth_gap, _depth_gap),
)


# --------------------------------------------------------------------------- judging


def outcome(checks: Sequence[Check]) -> str:
    scores = [c.score for c in checks if c.score is not None]
    if not scores:
        return "not testable"
    if min(scores) == 2:
        return "reproduced"
    return "partly" if max(scores) >= 1 else "not reproduced"


def _reason(checks: Sequence[Check]) -> str:
    if not checks:
        return "not measured: no saved run holds the statistic"
    if len(checks) == 1:
        return checks[0].why
    tested = [c for c in checks if c.score is not None]
    parts = [f"{sum(c.score == 2 for c in tested)} of {len(tested)} testable show it"] if tested else []
    parts += [c.why for c in tested] + [f"{c.label}: not testable, {c.why}" for c in checks if c.score is None]
    return "; ".join(parts)


def judge(rule: Rule, ev: Evidence, model: str, paper: pd.DataFrame | None = None) -> Verdict:
    ref = rule.reference(paper_reference() if paper is None else paper)
    if not ev.has(rule.chapter):
        return Verdict(rule.name, model, "not testable", (), f"no readable saved run of chapter {rule.chapter}")
    checks = tuple(rule.test(ev, ref))
    return Verdict(rule.name, model, outcome(checks), checks, _reason(checks))


# --------------------------------------------------------------------------- evidence from saved runs


def _rows(chapter: str, rows: Sequence[tuple[str, float, float, float, float]]) -> pd.DataFrame:
    return pd.DataFrame([(chapter, *r) for r in rows], columns=EVIDENCE_COLUMNS).astype({c: float for c in EVIDENCE_COLUMNS[2:]})


def _boot(run: Run) -> dict[str, int]:
    return {"n_boot": int(run.params.get("n_boot", 1000)), "seed": int(run.params.get("seed", 0))}


def _share(k: float, n: float, run: Run) -> tuple[float, float, float, float]:
    ci = bootstrap_ci(np.r_[np.ones(int(round(k))), np.zeros(int(n) - int(round(k)))], **_boot(run))
    return ci.estimate, ci.lo, ci.hi, float(ci.n)


def _derive_01(run: Run, other: Callable[[str], Run | None]) -> list[tuple]:
    fl = run["flip_rates"]
    last = fl[fl["layer"] == int(run.model["n_blocks"]) - 1]
    return [(Q_AGREE, *_share(last["n"].sum() - last["n_flipped"].sum(), last["n"].sum(), run))] if len(last) else []


def _derive_02(run: Run, other: Callable[[str], Run | None]) -> list[tuple]:
    from depthkit.analyses import mcq
    from depthkit.chapters import ch02_mcq_collection_vs_reasoning as ch02

    L, boot = int(run.model["n_blocks"]), _boot(run)
    ranks, acc = run["option_ranks"], run["accuracy"].set_index("task")
    baseline = mcq.majority_baseline(run["prompts"])
    exits = run["early_exit"]
    rows: list[tuple] = []
    for task, a in acc.iterrows():
        rows += [(f"{Q_ACCURACY} ({task})", *_share(a["accuracy"] * a["n"], a["n"], run)),
                 (f"{Q_BASELINE} ({task})", float(baseline.get(task, np.nan)), np.nan, np.nan, a["n"]),
                 (f"{Q_ONE_ANSWER} ({task})", a["majority_share"], np.nan, np.nan, a["n"])]
        e = exits[(exits["task"] == task) & (exits["layer"] == L - 1)]
        if len(e):
            rows.append((f"{Q_AGREE} ({task})", *_share(e["agreement"].iloc[0] * e["n"].iloc[0], e["n"].iloc[0], run)))
        d = ch02.order_difference(ranks, task, **boot)
        rows.append((f"{Q_ORDER} ({task})", d.estimate / L, d.lo / L, d.hi / L, d.n))
    sweep = run["patching"]
    pt = run["patching_transitions"]
    for direction in pt.loc[pt["what"] == ch02.TRANSITION, "direction"]:
        target = direction.split(" → ")[1]
        if target in set(ranks["task"]):
            d = ch02.transition_difference(sweep[sweep["direction"] == direction], ranks, target, **boot)
            rows.append((f"{Q_PATCH_GAP} ({direction})", d.estimate / L, d.lo / L, d.hi / L, d.n))
    return rows


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


def _derive_05(run: Run, other: Callable[[str], Run | None]) -> list[tuple]:
    if "phase_test" not in run.tables:
        return []
    t = run["phase_test"].iloc[0]
    edge = min(t["split"] - t["first_knot"], t["last_knot"] - t["split"])
    return [(Q_SLOPE, t["slope_change"], t["slope_change_lo"], t["slope_change_hi"], t["n"]),
            (Q_EDGE, edge, np.nan, np.nan, t["n"])]


def _classes_06(scores: pd.DataFrame, min_group: int) -> pd.DataFrame | None:
    """The tokens chapter 06 compares by word class, as its ``pos_tables`` keeps them:
    correctly predicted first pieces of words, in tags with at least ``min_group``
    tokens (the saved scores carry each token's tag, not its class)."""
    from depthkit.analyses.part_of_speech import word_class

    if "word_class" in scores:
        return scores
    if not {"pos", "correct", "first_piece"} <= set(scores.columns):
        return None
    kept = scores[scores["correct"].astype(bool) & scores["first_piece"].astype(bool)]
    counts = kept["pos"].value_counts()
    kept = kept[kept["pos"].isin(counts[counts >= min_group].index)]
    return kept.assign(word_class=kept["pos"].map(word_class))


def _derive_06(run: Run, other: Callable[[str], Run | None]) -> list[tuple]:
    from depthkit.chapters.ch06_depth_score import class_difference

    s = run["scores"]
    agree = unit_mean(s.assign(agree=s["settles_on_final"].astype(float)), "agree", "item", **_boot(run)).iloc[0]
    rows = [(Q_AGREE, agree["estimate"], agree["lo"], agree["hi"], agree["n"])]
    kept = _classes_06(s, int(run.params.get("min_group", 1)))
    if kept is not None:
        counts = kept["word_class"].value_counts()
        rows += [(Q_CLASS_TOKENS.format(c=c), float(counts.get(c, 0)), np.nan, np.nan, np.nan) for c in ("function", "content")]
        gap = class_difference(kept, **_boot(run))
        rows.append((Q_DEPTH_GAP, gap.estimate, gap.lo, gap.hi, gap.n))
    return rows


DERIVED: dict[str, Callable[[Run, Callable[[str], Run | None]], list[tuple]]] = {
    "01": _derive_01, "02": _derive_02, "03": _derive_03, "04": _derive_04, "05": _derive_05, "06": _derive_06,
}
_READ_ERRORS = (ResultsError, KeyError, AttributeError, ValueError, IndexError, TypeError)


def _runs(model: str, root: Path) -> dict[str, Run]:
    out = {}
    for ch in CHAPTERS.values():
        if ch.reads_results:
            continue
        try:
            out[ch.id] = load_run(model, ch.slug, root=root)
        except ResultsError:
            continue
    return out


def evidence(model: str, root: str | Path | None = None, runs: dict[str, Run] | None = None) -> Evidence:
    """Every chapter's headlines for ``model`` (layers as ℓ/L) and the quantities the
    rules derive from the saved tables. A run that cannot be read adds nothing."""
    runs = _runs(model, saved.results_root(root)) if runs is None else runs
    frames = []
    for key, run in runs.items():
        try:
            h = run_headlines(run, CHAPTERS[key])
        except _READ_ERRORS:
            continue
        frames.append(h.assign(value=h["value_norm"], lo=h["lo_norm"], hi=h["hi_norm"])[EVIDENCE_COLUMNS])
        if key not in DERIVED:
            continue
        try:
            frames.append(_rows(key, DERIVED[key](run, runs.get)))
        except _READ_ERRORS as err:
            # A run saved without a table the rules need: its verdicts say "not measured".
            warnings.warn(f"{model}, chapter {key}: {type(err).__name__}: {str(err)[:160]}", stacklevel=2)
    return Evidence(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=EVIDENCE_COLUMNS))


# --------------------------------------------------------------------------- robustness and the findings table


def _variant(main: Run | None, other: Run, folder: str) -> str:
    """What differs in ``other``'s parameters from the main run (else the folder)."""
    base = main.params if main is not None else {}
    diff = [f"{k}={other.params[k]}" for k in VARIANT_PARAMS if k in other.params and other.params.get(k) != base.get(k)]
    return ", ".join(diff) or folder


def robustness_roots(root: str | Path | None = None) -> list[Path]:
    folder = saved.results_root(root) / ROBUSTNESS_DIR
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def _robustness(
    rule: Rule, model: str, main: dict[str, Run], others: Sequence[tuple[Path, dict[str, Run], Evidence]], paper: pd.DataFrame,
    verdict: str,
) -> str:
    """Whether ``verdict`` (the main run's) holds in every robustness run of the
    rule's chapter: "stable (…)", or the variants that change it, with their verdicts."""
    parts = [
        (_variant(main.get(rule.chapter), runs[rule.chapter], folder.name), judge(rule, ev, model, paper).outcome)
        for folder, runs, ev in others if rule.chapter in runs
    ]
    if not parts:
        return "not run"
    same = [v for v, o in parts if o == verdict]
    changed = [f"{v}: {o}" for v, o in parts if o != verdict]
    if not changed:
        return f"stable: {verdict} under {', '.join(same)}"
    return f"changes under {'; '.join(changed)}" + (f" (same under {', '.join(same)})" if same else "")


def _values(v: Verdict) -> str:
    shown = [c for c in v.checks if c.stat is not None and math.isfinite(c.stat.value)]
    if len(v.checks) == 1 and shown:
        return _ci(shown[0].stat)
    return "; ".join(f"{c.label} {_ci(c.stat)}" for c in shown) or "—"


@dataclass(frozen=True)
class Finding:
    rule: Rule
    reference: Reference
    verdict: Verdict
    robustness: str


def findings(models: Sequence[str] = (), results_root: str | Path | None = None) -> list[Finding]:
    """Every rule judged on every model (``models`` empty: each with saved results),
    with the verdicts of its robustness runs (:data:`ROBUSTNESS_DIR`)."""
    root = saved.results_root(results_root)
    runs = list_runs(root)
    paper = paper_reference()
    out = []
    for model in list(models) or sorted(runs["model"].unique()):
        main = _runs(model, root)
        ev = evidence(model, root, main)
        others = [(r, o, evidence(model, r, o)) for r in robustness_roots(root) if (o := _runs(model, r))]
        for rule in RULES:
            verdict = judge(rule, ev, model, paper)
            out.append(Finding(rule, rule.reference(paper), verdict, _robustness(rule, model, main, others, paper, verdict.outcome)))
    return out


FINDINGS_COLUMNS = ["claim", "chapter", "paper (reference)", "model", "value [95 % CI]", "verdict", "why", "robustness"]


def as_table(found: Sequence[Finding]) -> pd.DataFrame:
    """One row per finding: the paper's reference, the model's statistic with its
    interval, the verdict, its one-line reason and the robustness runs' verdicts."""
    rows = [(f.rule.claim, f.rule.chapter, f.reference.text, f.verdict.model, _values(f.verdict), f.verdict.outcome,
             f.verdict.reason, f.robustness) for f in found]
    return pd.DataFrame(rows, columns=FINDINGS_COLUMNS)


def findings_table(models: Sequence[str] = (), results_root: str | Path | None = None) -> pd.DataFrame:
    return as_table(findings(models, results_root))


CAVEAT_COLUMNS = ["model", "chapter", "quantity", "testable", "caveat"]


def caveats(found: Sequence[Finding]) -> pd.DataFrame:
    """The headline quantities each short-falling check reads, with why: a check
    that is not testable, or that shows less than the paper states."""
    rows = [
        (f.verdict.model, f.rule.chapter, q.format(unit=c.label), c.score is not None, f"{f.rule.claim}: {c.why}")
        for f in found for c in f.verdict.checks if c.score != 2 for q in f.rule.reads
    ]
    return pd.DataFrame(rows, columns=CAVEAT_COLUMNS).drop_duplicates(["model", "quantity", "caveat"], ignore_index=True)


def rules_table() -> pd.DataFrame:
    """The rules as declared: claim, chapter, statistic, testability conditions."""
    return pd.DataFrame([(r.claim, r.chapter, r.statistic, r.conditions) for r in RULES],
                        columns=["claim", "chapter", "statistic", "testable when"])


# --------------------------------------------------------------------------- the page


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(frame: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def _tally(table: pd.DataFrame) -> Iterator[str]:
    for model, g in table.groupby("model", sort=False):
        counts = g["verdict"].value_counts()
        yield f"* **{model}**: " + ", ".join(f"{counts.get(o, 0)} {o}" for o in OUTCOMES) + "."


def findings_markdown(table: pd.DataFrame) -> str:
    """The findings page's body: a tally per model, the verdicts, the rules."""
    if table.empty:
        return ("**No saved results yet.** Run the chapters (e.g. `depthkit run 01 --model smollm2-135m`) "
                "and rebuild the book; this page fills in from what they save.\n")
    shown = table.drop(columns="chapter").assign(claim=table["claim"] + " (ch. " + table["chapter"] + ")")
    return "\n\n".join([
        "## Verdicts\n\n" + "\n".join(_tally(table)),
        markdown_table(shown),
        "Values are this book's runs: layers as ℓ/L, shares as fractions, differences as fractions of the depth, each "
        "with its 95 % bootstrap interval. The paper's values are reference values for its own models "
        "(GPT2-XL, 48 blocks; Pythia-6.9B, Llama-2-7B and Llama-3-8B, 32 blocks each). *Robustness* lists the verdicts "
        f"of runs of the same model with another lens, convention or seed and whether the verdict survives them "
        f"(kept under `reference/{ROBUSTNESS_DIR}/<variant>/`, made with e.g. "
        "`depthkit run 04 --reference --variant logit -p lens=logit`).",
        "## The rules, fixed before the results\n\n" + markdown_table(rules_table()),
        "A claim is *reproduced* when every testable unit (the run, a task, a direction) shows it as the paper states it, "
        "*partly* when some unit shows at least its direction, *not reproduced* when none does and *not testable* when "
        "no unit meets the conditions. A difference counts only where its interval excludes zero (or the paper's bound).",
    ]) + "\n"


def write_findings_page(book_dir: str | Path, results_root: str | Path | None = None) -> Path:
    """Write ``book/_generated/findings.md`` from the saved results (unchanged text
    keeps the file's timestamp, so Sphinx's incremental build holds)."""
    target = Path(book_dir) / FINDINGS_PAGE
    text = findings_markdown(findings_table((), results_root))
    if not target.is_file() or target.read_text(encoding="utf-8") != text:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, text)
    return target


__all__ = [
    "OUTCOMES", "RULES", "Check", "Evidence", "Finding", "Reference", "Rule", "Stat", "Verdict", "as_table", "caveats",
    "evidence", "findings", "findings_markdown", "findings_table", "judge", "outcome", "robustness_roots", "rules_table",
    "write_findings_page",
]
