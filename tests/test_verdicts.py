"""The pre-registered verdict rules: every outcome of every rule on synthetic
evidence, and the findings page from synthetic saved runs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from depthkit import verdicts as vd
from depthkit.chapters.ch01_guess_then_refine import Q_FINAL, Q_FLIP, Q_L1
from depthkit.core.results import RunRecorder

NAN = math.nan


def evidence(*rows: tuple) -> vd.Evidence:
    return vd.Evidence(pd.DataFrame(rows, columns=vd.EVIDENCE_COLUMNS))


def verdict(name: str, *rows: tuple) -> vd.Verdict:
    rule = next(r for r in vd.RULES if r.name == name)
    return vd.judge(rule, evidence(*rows), "m")


def test_every_rule_is_declared_once_with_its_paper_reference() -> None:
    names = [r.name for r in vd.RULES]
    assert len(names) == len(set(names)) == 9
    refs = {r.name: r.reference(vd.paper_reference()) for r in vd.RULES}
    assert refs["frequent early guesses"].value == 0.75
    assert refs["function words before content words"].value == pytest.approx(15 / 32)
    assert refs["first answer token deepest"].value == pytest.approx(7 / 32)
    assert refs["options collected first"].value == 0.5 and refs["answer chosen later"].value == 0.5
    assert set(vd.rules_table()["chapter"]) == {"01", "02", "03", "04", "05", "06"}


# --------------------------------------------------------------------------- chapter 01

CH01 = [("01", vd.Q_AGREE, 0.9, 0.85, 0.95, 400), ("01", Q_FINAL, 0.30, 0.25, 0.35, 400)]


@pytest.mark.parametrize(
    ("l1", "extra", "expected"),
    [
        ((0.85, 0.80, 0.90, 400), [], "reproduced"),
        ((0.55, 0.50, 0.60, 400), [], "partly"),
        ((0.79, 0.752, 0.83, 400), [], "partly"),  # its lower end prints as the paper's 75%
        ((0.33, 0.28, 0.38, 400), [], "not reproduced"),
        ((0.85, 0.80, 0.90, 400), [("01", vd.Q_AGREE, 0.39, 0.3, 0.45, 400)], "not testable"),
        ((0.85, NAN, NAN, 5), [], "not testable"),
    ],
)
def test_frequent_early_guesses(l1, extra, expected) -> None:
    rows = extra + CH01 if extra else CH01
    v = verdict("frequent early guesses", *rows, ("01", Q_L1, *l1))
    assert v.outcome == expected
    if expected == "partly":
        assert "30% [25%, 35%]" in v.reason and "but not clearly above the paper's 75%" in v.reason
    if l1[0] == 0.55:
        assert "55% [50%, 60%]" in v.reason
    if l1[3] == 5:
        assert "fewer than 10" in v.reason


@pytest.mark.parametrize(
    ("flip", "expected"),
    [((0.85, 0.8, 0.9, 300), "reproduced"), ((0.62, 0.55, 0.69, 300), "partly"),
     ((0.45, 0.4, 0.5, 300), "not reproduced"), ((0.9, NAN, NAN, 4), "not testable")],
)
def test_early_guesses_overturned(flip, expected) -> None:
    assert verdict("early guesses overturned", *CH01, ("01", Q_FLIP, *flip)).outcome == expected


def test_a_lens_below_the_floor_makes_chapter_01_untestable() -> None:
    v = verdict("early guesses overturned", ("01", vd.Q_AGREE, 0.46, 0.4, 0.5, 400), ("01", Q_FLIP, 0.85, 0.8, 0.9, 300))
    assert v.outcome == "not testable" and "46%" in v.reason and "floor of 50%" in v.reason


def test_a_missing_chapter_is_not_testable() -> None:
    v = verdict("early guesses overturned", ("04", vd.Q_CLASSES, 1, NAN, NAN, NAN))
    assert v.outcome == "not testable" and "chapter 01" in v.reason


# --------------------------------------------------------------------------- chapter 04


def ch04(gap=(0.3, 0.2, 0.4, 100), matched=(0.25, 0.1, 0.4), adjusted=(0.2, 0.05, 0.35), comparable=1.0, agree=0.8):
    return [("04", vd.Q_CLASSES, comparable, NAN, NAN, NAN), ("04", vd.Q_AGREE, agree, agree - 0.05, agree + 0.05, 200),
            ("04", vd.Q_CLASS_GAP, *gap), ("04", vd.Q_MATCHED, *matched, NAN), ("04", vd.Q_ADJUSTED, *adjusted, NAN)]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (ch04(), "reproduced"),
        (ch04(matched=(0.1, -0.1, 0.3)), "partly"),
        (ch04(gap=(0.05, -0.05, 0.2, 100)), "not reproduced"),
        (ch04(gap=(-0.2, -0.3, -0.1, 100)), "not reproduced"),
        (ch04(comparable=0.0), "not testable"),
        (ch04(agree=0.3), "not testable"),
    ],
)
def test_function_words_before_content_words(rows, expected) -> None:
    v = verdict("function words before content words", *rows)
    assert v.outcome == expected
    if expected == "partly":
        assert "frequency controls" in v.reason and "0.10 [-0.10, 0.30]" in v.reason


# --------------------------------------------------------------------------- chapter 03


def ch03(t2=(0.2, 0.1, 0.3, 40), t3=(0.3, 0.15, 0.45, 20), agree=0.9):
    return [("03", vd.Q_AGREE, agree, agree - 0.05, agree + 0.05, 100),
            ("03", vd.Q_TOKEN_GAP.format(t=2), *t2), ("03", vd.Q_TOKEN_GAP.format(t=3), *t3)]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (ch03(), "reproduced"),
        (ch03(t3=(0.0, -0.1, 0.1, 20)), "partly"),
        (ch03(t2=(0.0, -0.1, 0.1, 40), t3=(-0.1, -0.2, 0.05, 20)), "not reproduced"),
        (ch03(t2=(0.2, NAN, NAN, 3), t3=(0.2, NAN, NAN, 2)), "not testable"),
        (ch03(agree=0.2), "not testable"),
    ],
)
def test_first_answer_token_deepest(rows, expected) -> None:
    assert verdict("first answer token deepest", *rows).outcome == expected


def test_a_unit_without_enough_answers_drops_out_of_the_tally() -> None:
    v = verdict("first answer token deepest", *ch03(t3=(0.2, NAN, NAN, 4)))
    assert v.outcome == "reproduced" and "1 of 1 testable" in v.reason and "token 1 − token 3: not testable" in v.reason


# --------------------------------------------------------------------------- chapter 02


def task(name, collected=(0.3, 0.2, 0.4), settled=(0.8, 0.7, 0.9), order=(0.4, 0.3, 0.5), acc=(0.5, 0.43, 0.57),
         baseline=0.26, one=0.4, agree=0.7, n=200):
    return [("02", f"MCQ options collected ({name})", *collected, n), ("02", f"MCQ answer settled ({name})", *settled, n),
            ("02", f"{vd.Q_ORDER} ({name})", *order, n), ("02", f"{vd.Q_ACCURACY} ({name})", *acc, n),
            ("02", f"{vd.Q_BASELINE} ({name})", baseline, NAN, NAN, n), ("02", f"{vd.Q_ONE_ANSWER} ({name})", one, NAN, NAN, n),
            ("02", f"{vd.Q_AGREE} ({name})", agree, agree - 0.05, agree + 0.05, n)]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (task("mmlu") + task("rte"), "reproduced"),
        (task("mmlu") + task("rte", collected=(0.6, 0.5, 0.7)), "partly"),
        (task("mmlu", collected=(0.45, 0.35, 0.55)) + task("rte", collected=(0.6, 0.5, 0.7)), "not reproduced"),
        (task("mmlu", acc=(0.3, 0.2, 0.35)) + task("sst2", one=1.0) + task("mrpc", agree=0.46), "not testable"),
    ],
)
def test_options_collected_first(rows, expected) -> None:
    assert verdict("options collected first", *rows).outcome == expected


def test_untestable_tasks_are_named_with_why() -> None:
    v = verdict("options collected first", *task("mmlu"), *task("sst2", one=1.0), *task("mrpc", agree=0.39))
    assert v.outcome == "reproduced"
    assert "sst2: not testable, one answer to 100% of prompts" in v.reason
    assert "mrpc: not testable, the lens agrees with the model at layer L−1 on 39% of prompts" in v.reason
    assert len(v.checks) == 3 and [c.score for c in v.checks] == [2, None, None]


def test_accuracy_must_clear_the_baseline_by_its_interval() -> None:
    v = verdict("options collected first", *task("mmlu", acc=(0.3, 0.24, 0.36), baseline=0.26))
    assert v.outcome == "not testable" and "majority baseline of 26%" in v.reason
    # judged as printed: a lower end of 26.04 % shows as 26 %, the baseline's own value
    assert verdict("options collected first", *task("mmlu", acc=(0.3, 0.2604, 0.36), baseline=0.26)).outcome == "not testable"
    assert verdict("options collected first", *task("mmlu", acc=(0.3, 0.2651, 0.36), baseline=0.26)).outcome == "reproduced"


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (task("mmlu") + task("rte"), "reproduced"),
        (task("mmlu", settled=(0.45, 0.35, 0.55)) + task("rte"), "partly"),
        (task("mmlu", order=(0.0, -0.1, 0.1)) + task("rte", order=(-0.2, -0.3, -0.1)), "not reproduced"),
        (task("sst2", one=0.95), "not testable"),
    ],
)
def test_answer_chosen_later(rows, expected) -> None:
    assert verdict("answer chosen later", *rows).outcome == expected


def test_an_order_against_the_output_row_is_a_bound_or_not_measured() -> None:
    # Both only at the output: no order exists, whatever the (degenerate) difference says.
    both = verdict("answer chosen later", *task("mmlu", collected=(1.0, 1.0, 1.0), settled=(1.0, 1.0, 1.0), order=(0.0, 0.0, 0.0)))
    assert both.outcome == "not testable" and "no order can be measured" in both.reason
    assert both.checks[0].stat is None  # no difference of two censored layers is shown as a value
    # Settled only at the output: the measured gap is a lower bound, still a finding.
    late = verdict("answer chosen later", *task("mmlu", settled=(1.0, 0.9, 1.0), order=(0.6, 0.5, 0.7)))
    assert late.outcome == "reproduced" and "settled minus collected at least 0.60" in late.reason
    # Collected only at the output: any gap is an upper bound, so "later" cannot be shown.
    early = verdict("answer chosen later", *task("mmlu", collected=(1.0, 1.0, 1.0), settled=(0.5, 0.4, 0.6), order=(0.2, 0.1, 0.3)))
    assert early.outcome == "not reproduced" and "collected only at the output" in early.reason


def patch(direction: str, gap=(0.2, 0.1, 0.3), n=50):
    return [("02", f"{vd.Q_PATCH_GAP} ({direction})", *gap, n)]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (task("mmlu") + patch("sst2 → mmlu"), "reproduced"),
        (task("mmlu") + task("sst2") + patch("sst2 → mmlu") + patch("mmlu → sst2", (-0.2, -0.3, -0.1)), "reproduced"),
        (task("mmlu") + task("sst2") + patch("sst2 → mmlu") + patch("mmlu → sst2", (0.0, -0.1, 0.1)), "partly"),
        (task("mmlu") + patch("sst2 → mmlu", (0.0, -0.1, 0.1)), "not reproduced"),
        (task("mmlu", agree=0.39) + patch("sst2 → mmlu") + patch("mmlu → sst2", (0.2, NAN, NAN), n=5), "not testable"),
    ],
)
def test_patching_apart_from_the_lens(rows, expected) -> None:
    assert verdict("patching apart from the lens", *rows).outcome == expected


# --------------------------------------------------------------------------- chapters 05 and 06


@pytest.mark.parametrize(
    ("slope", "edge", "expected"),
    [((0.05, 0.02, 0.08, 24), 5, "reproduced"), ((0.05, 0.02, 0.08, 24), 1, "partly"),
     ((0.01, -0.01, 0.03, 24), 5, "not reproduced"), ((0.05, 0.02, 0.08, 24), 0, "not reproduced"),
     ((0.05, NAN, NAN, 4), 5, "not testable")],
)
def test_residual_phase_change(slope, edge, expected) -> None:
    v = verdict("residual phase change", ("05", vd.Q_SLOPE, *slope), ("05", vd.Q_EDGE, edge, NAN, NAN, 24))
    assert v.outcome == expected
    if edge == 0:
        assert "edge of the fit range" in v.reason
    if expected != "not testable":
        assert v.reason.startswith(f"slope change at ℓ*: {slope[0]:.2f} [")


def ch06(gap=(0.1, 0.05, 0.15, 24), function=500, content=300, agree=0.8):
    return [("06", vd.Q_AGREE, agree, agree - 0.05, agree + 0.05, 24), ("06", vd.Q_DEPTH_GAP, *gap),
            ("06", vd.Q_CLASS_TOKENS.format(c="function"), function, NAN, NAN, NAN),
            ("06", vd.Q_CLASS_TOKENS.format(c="content"), content, NAN, NAN, NAN)]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [(ch06(), "reproduced"), (ch06(gap=(0.02, -0.02, 0.05, 24)), "not reproduced"),
     (ch06(content=3), "not testable"), (ch06(agree=0.3), "not testable"),
     # "0.05 [0.00, 0.10]": an end that prints as zero is no finding
     (ch06(gap=(0.05, 0.004, 0.1, 24)), "not reproduced"), (ch06(gap=(0.05, 0.006, 0.1, 24)), "reproduced")],
)
def test_content_words_deeper_in_running_text(rows, expected) -> None:
    assert verdict("content words deeper in running text", *rows).outcome == expected


def test_outcome_tally() -> None:
    def c(score):
        return vd.Check("u", None, score, "")

    assert vd.outcome([]) == "not testable"
    assert vd.outcome([c(None), c(2)]) == "reproduced"
    assert vd.outcome([c(2), c(0)]) == "partly"
    assert vd.outcome([c(1)]) == "partly"
    assert vd.outcome([c(0), c(None)]) == "not reproduced"


# --------------------------------------------------------------------------- saved runs and the page


def _save_01(root, name: str, n_blocks: int, l1: float, flipped: int) -> None:
    info = {"name": name, "n_blocks": n_blocks}
    layers = [1, n_blocks - 1, n_blocks]
    shares = pd.DataFrame({"layer": layers, "bucket": "Top 1-10", "share": [l1, 0.4, 0.3], "lo": [l1 - 0.04, 0.35, 0.25],
                           "hi": [l1 + 0.04, 0.45, 0.35], "n": 100, "n_total": 400})
    flips = pd.DataFrame({"layer": [1, n_blocks - 1, n_blocks - 1], "bucket": ["Top 1-10", "Top 1-10", "rest"],
                          "flip_rate": [flipped / 300, 0.1, 0.2], "lo": [flipped / 300 - 0.05, 0.05, 0.1],
                          "hi": [flipped / 300 + 0.05, 0.15, 0.3], "n": [300, 200, 200], "n_flipped": [flipped, 20, 40]})
    with RunRecorder("01_guess_then_refine", info, {"n_boot": 50, "seed": 0, "lens": "tuned"}, 0, root=root) as rec:
        rec.table("bucket_shares", shares)
        rec.table("final_bucket_shares", shares[shares["layer"] == n_blocks])
        rec.table("flip_rates", flips)


def _save_05(root, name: str, n_blocks: int, split: float, lens: str = "tuned", convention: str = "canonical") -> None:
    info = {"name": name, "n_blocks": n_blocks}
    transitions = pd.DataFrame({"name": ["ℓ* (two-segment fit, log block_rel)"], "estimate": [split], "lo": [split - 1],
                                "hi": [split + 1], "n": [24.0]})
    test = pd.DataFrame([{"split": split, "slope_change": 0.05, "slope_change_lo": 0.02, "slope_change_hi": 0.08,
                          "first_knot": 2.0, "last_knot": n_blocks - 2.0, "two_segments": split > 2, "n": 24}])
    with RunRecorder("05_residual_phase_change", info, {"lens": lens, "convention": convention, "seed": 0}, 0, root=root) as rec:
        rec.table("transitions", transitions)
        rec.table("phase_test", test)


def test_findings_from_saved_runs(tmp_path) -> None:
    _save_01(tmp_path, "model-a", 30, 0.85, 270)
    _save_05(tmp_path, "model-a", 30, 12.0)
    _save_01(tmp_path, "model-b", 18, 0.35, 120)
    table = vd.findings_table([], tmp_path)
    assert list(table.columns) == vd.FINDINGS_COLUMNS
    assert len(table) == 2 * len(vd.RULES) and list(table["model"].unique()) == ["model-a", "model-b"]
    a = table[table["model"] == "model-a"].set_index("claim")
    freq = next(r.claim for r in vd.RULES if r.name == "frequent early guesses")
    phase = next(r.claim for r in vd.RULES if r.name == "residual phase change")
    assert a.loc[freq, "verdict"] == "reproduced" and a.loc[freq, "value [95 % CI]"] == "0.85 [0.81, 0.89]"
    assert a.loc[phase, "verdict"] == "reproduced" and "ℓ* interior" in a.loc[phase, "why"]
    assert "> 75% at layer 1, ≈ 33% at the output (Pythia-6.9B)" == a.loc[freq, "paper (reference)"]
    b = table[table["model"] == "model-b"].set_index("claim")
    assert b.loc[freq, "verdict"] == "not reproduced"
    assert b.loc[phase, "verdict"] == "not testable" and "chapter 05" in b.loc[phase, "why"]
    assert (table["robustness"] == "not run").all()
    # model-a's lens agreement at L−1: 20 + 40 of 400 prompts flipped, so 85 % agree (above the floor).
    ev = vd.evidence("model-a", tmp_path)
    assert ev.get("01", vd.Q_AGREE).value == pytest.approx(0.85)


def test_robustness_runs_fill_their_column(tmp_path) -> None:
    _save_05(tmp_path, "model-a", 30, 12.0)
    _save_05(tmp_path / vd.ROBUSTNESS_DIR / "logit", "model-a", 30, 2.0, lens="logit")
    assert vd.robustness_roots(tmp_path) == [tmp_path / vd.ROBUSTNESS_DIR / "logit"]
    table = vd.findings_table(["model-a"], tmp_path).set_index("claim")
    phase = next(r.claim for r in vd.RULES if r.name == "residual phase change")
    assert table.loc[phase, "robustness"] == "changes under lens=logit: not reproduced"
    _save_05(tmp_path / vd.ROBUSTNESS_DIR / "authors", "model-a", 30, 12.0, lens="tuned", convention="authors")
    table = vd.findings_table(["model-a"], tmp_path).set_index("claim")
    assert table.loc[phase, "robustness"] == "changes under lens=logit: not reproduced (same under convention=authors)"
    import shutil

    shutil.rmtree(tmp_path / vd.ROBUSTNESS_DIR / "logit")
    table = vd.findings_table(["model-a"], tmp_path).set_index("claim")
    assert table.loc[phase, "robustness"] == "stable: reproduced under convention=authors"
    freq = next(r.claim for r in vd.RULES if r.name == "frequent early guesses")
    assert table.loc[freq, "robustness"] == "not run"


def test_findings_page(tmp_path) -> None:
    results = tmp_path / "results"
    book = tmp_path / "book"
    empty = vd.write_findings_page(book, results)
    assert empty == book / vd.FINDINGS_PAGE and "No saved results yet" in empty.read_text()
    _save_01(results, "model-a", 30, 0.85, 190)
    text = vd.write_findings_page(book, results).read_text()
    assert "* **model-a**: 1 reproduced, 1 partly, 0 not reproduced, 7 not testable." in text
    assert "| Early layers guess one of the most frequent tokens (guess, then refine) (ch. 01) |" in text
    assert "## The rules, fixed before the results" in text and f"≥ {vd.LENS_FLOOR:.0%}" in text
    before = (book / vd.FINDINGS_PAGE).stat().st_mtime_ns
    vd.write_findings_page(book, results)
    assert (book / vd.FINDINGS_PAGE).stat().st_mtime_ns == before


def test_derived_quantities_from_saved_tables(tmp_path) -> None:
    """Chapter 03's paired token gaps and chapter 06's class gap come from their saved tables, on ℓ/L."""
    rng = np.random.default_rng(0)
    n, L = 30, 20
    onsets = pd.concat([
        pd.DataFrame({"item": np.arange(n), "token": t, "k": 1, "onset": base + rng.integers(0, 3, n).astype(float),
                      "correct": True, "dataset": "curated"})
        for t, base in ((1, 15), (2, 8), (3, 8))
    ], ignore_index=True)
    ranks = pd.DataFrame({"item": np.arange(n), "token": 1, "layer": L - 1, "rank": [1] * 20 + [2] * 10, "correct": True})
    k1 = pd.DataFrame({"dataset": "curated", "token": [1, 2, 3], "correct": True, "mean_onset": [16.0, 9.0, 9.0],
                       "lo": [15.0, 8.0, 8.0], "hi": [17.0, 10.0, 10.0], "n_reached": n})
    with RunRecorder("03_fact_recall", {"name": "m", "n_blocks": L}, {"dataset": "curated", "n_boot": 100, "seed": 0}, 0,
                     root=tmp_path) as rec:
        rec.table("onset_k1", k1)
        rec.table("onsets", onsets)
        rec.table("answer_ranks", ranks)
    scores = pd.DataFrame({"item": np.repeat(np.arange(12), 10), "word_class": ["function", "content"] * 60,
                           "d1_norm": [0.2, 0.6] * 60, "settles_on_final": [True, True, True, False] * 30})
    headline = pd.DataFrame({"quantity": ["mean onset depth d1/L"], "value": [0.4], "lo": [0.35], "hi": [0.45], "n": [12.0]})
    with RunRecorder("06_depth_score", {"name": "m", "n_blocks": L}, {"n_boot": 100, "seed": 0}, 0, root=tmp_path) as rec:
        rec.table("headline", headline)
        rec.table("scores", scores)
    ev = vd.evidence("m", tmp_path)
    assert ev.get("03", vd.Q_AGREE).value == pytest.approx(20 / 30)
    gap = ev.get("03", vd.Q_TOKEN_GAP.format(t=2))
    assert gap.value == pytest.approx(7 / L, abs=0.1 / L * 10) and gap.lo > 0 and gap.n == n
    assert ev.get("06", vd.Q_DEPTH_GAP).value == pytest.approx(0.4) and ev.get("06", vd.Q_AGREE).value == 0.75
    assert ev.get("06", vd.Q_CLASS_TOKENS.format(c="content")).value == 60
    assert vd.judge(vd.RULES[3], ev, "m").outcome == "reproduced"
    assert vd.judge(vd.RULES[8], ev, "m").outcome == "reproduced"


def _mcq_run(root, L: int = 10, n: int = 40) -> None:
    """A chapter 02 run built with the chapter's own functions: options collected from
    layer 3, the answer (gold for 3 of 4 prompts) leading from layer 7 on."""
    from depthkit.analyses import mcq
    from depthkit.chapters import ch02_mcq_collection_vs_reasoning as ch02

    rng = np.random.default_rng(0)
    gold = rng.integers(0, 4, n)
    answer = np.where(np.arange(n) % 4 == 0, (gold + 1) % 4, gold)
    rows = []
    for item in range(n):
        for layer in range(L + 1):
            lead = answer[item] if layer >= 7 else (answer[item] + 1 + layer % 3) % 4
            for option in range(4):
                rank = (1 if option == lead else 2 + option) if layer >= 3 else 100 + option
                rows.append(("mmlu", item, item, layer, option, 1000 + option, rank, 1.0 / (rank + 1), option == gold[item], True))
    ranks = pd.DataFrame(rows, columns=["task", "item", "example", "layer", "option", "token_id", "rank", "prob", "is_gold",
                                        "top1_is_option"])
    prompts = pd.DataFrame({"task": "mmlu", "example": np.arange(n), "gold": gold})
    exits = pd.DataFrame({"task": "mmlu", "layer": np.arange(L + 1), "agreement": np.linspace(0.1, 1.0, L + 1), "n": n})
    sweep = pd.DataFrame([("sst2 → mmlu", False, pair, layer, "source-option" if layer >= 5 + pair % 2 else "target-option")
                          for pair in range(30) for layer in range(L + 1)], columns=["direction", "control", "pair", "layer", "class"])
    transitions = pd.DataFrame({"direction": ["sst2 → mmlu"], "what": [ch02.TRANSITION], "transition_layer": [0.0],
                                "lo": [0.0], "hi": [0.0], "n_pairs": [30.0]})
    est = mcq.layer_estimates(ranks, n_boot=100)
    with RunRecorder("02_mcq_collection_vs_reasoning", {"name": "m", "n_blocks": L}, {"n_boot": 100, "seed": 0}, 0,
                     root=root) as rec:
        for name, table in {"prompts": prompts, "option_ranks": ranks, "accuracy": mcq.accuracy(ranks), "layer_estimates": est,
                            "early_exit": exits, "patching": sweep, "patching_transitions": transitions}.items():
            rec.table(name, table)


def test_chapter_02_quantities_from_saved_tables(tmp_path) -> None:
    _mcq_run(tmp_path)
    ev = vd.evidence("m", tmp_path)
    assert ev.get("02", f"{vd.Q_ACCURACY} (mmlu)").value == 0.75 and ev.get("02", f"{vd.Q_ACCURACY} (mmlu)").lo > 0.5
    assert ev.get("02", f"{vd.Q_BASELINE} (mmlu)").value < 0.5
    assert ev.get("02", f"{vd.Q_ONE_ANSWER} (mmlu)").value < 0.5
    assert ev.get("02", f"{vd.Q_AGREE} (mmlu)").value == round(0.91 * 40) / 40
    order = ev.get("02", f"{vd.Q_ORDER} (mmlu)")
    assert order.value == pytest.approx((7 - 3) / 10) and order.lo > 0
    assert ev.labels("02", vd.Q_PATCH_GAP) == ["sst2 → mmlu"]
    gap = ev.get("02", f"{vd.Q_PATCH_GAP} (sst2 → mmlu)")
    assert gap.value == pytest.approx((6 - 3) / 10) and gap.n == 30
    found = {f.rule.name: f.verdict for f in vd.findings(["m"], tmp_path)}
    assert found["options collected first"].outcome == "reproduced"
    assert found["answer chosen later"].outcome == "reproduced"
    assert found["patching apart from the lens"].outcome == "reproduced"


def test_no_interval_shown_as_precise_and_the_output_row_is_censoring() -> None:
    assert vd._ci(vd.Stat(0.72, 0.72, 0.72, 50)) == "0.72 (in at least 95 % of resamples)"
    assert vd._ci(vd.Stat(0.5, 0.4, 0.6, 50)) == "0.50 [0.40, 0.60]"
    assert vd._layer_at(vd.Stat(1.0, 1.0, 1.0, 50)) == "the output, not before"
    assert vd._layer_at(vd.Stat(1.0, 0.9, 1.0, 50)) == "the output, not before (95 % CI from ℓ/L 0.90)"
    assert vd._layer_at(vd.Stat(0.4, 0.3, 0.5, 50)) == "ℓ/L 0.40 [0.30, 0.50]"


def test_chapter_06_classes_come_from_the_saved_tags() -> None:
    scores = pd.DataFrame({"pos": ["DET", "DET", "NOUN", "NOUN", "X"], "correct": [True, True, True, False, True],
                           "first_piece": [True, True, True, True, False]})
    kept = vd._classes_06(scores, min_group=1)
    assert kept["word_class"].tolist() == ["function", "function", "content"]
    assert vd._classes_06(scores, min_group=2)["pos"].tolist() == ["DET", "DET"]
    assert vd._classes_06(scores.drop(columns="pos"), 1) is None
