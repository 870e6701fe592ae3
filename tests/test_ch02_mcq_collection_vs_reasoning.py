"""Chapter 02's module on small constructed frames."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.chapters import ch02_mcq_collection_vs_reasoning as ch


class FakeRun:
    def __init__(self, tables: dict[str, pd.DataFrame]):
        self.tables = tables

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]


def ranks_frame(n_items: int = 12, n_layers: int = 5, collect_at: int = 1, decide_at: int = 3, balanced: bool = False) -> pd.DataFrame:
    """Two options; both in the top-2 from ``collect_at``; the final answer (option
    1, the gold one) is the most probable option from ``decide_at`` on, option 0
    before. ``balanced``: odd items swap the two options' roles, so the gold answer
    is option 0 for half the items (a majority baseline of 50 %)."""
    rows = []
    for item in range(n_items):
        answer = 0 if balanced and item % 2 else 1
        for layer in range(n_layers):
            collected = layer >= collect_at
            late = layer >= decide_at
            for opt in (0, 1):
                best = (opt == answer) == late
                rows.append({"task": "mmlu", "item": item, "layer": layer, "option": opt,
                             "rank": (1 if best else 2) if collected else (50 if best else 60),
                             "prob": 0.6 if best else 0.3, "is_gold": opt == answer, "top1_is_option": True})
    return pd.DataFrame(rows)


def _prompts(n_items: int, balanced: bool = True) -> pd.DataFrame:
    return pd.DataFrame({"task": "mmlu", "options": [(" A", " B")] * n_items,
                         "gold": [0 if balanced and i % 2 else 1 for i in range(n_items)]})


def test_order_difference_is_decision_minus_collection():
    ci = ch.order_difference(ranks_frame(), "mmlu", n_boot=50, seed=0)
    assert ci.estimate == 2 and ci.lo == 2 and ci.hi == 2 and ci.n == 12


def test_order_difference_has_no_interval_below_min_n():
    ci = ch.order_difference(ranks_frame(n_items=4), "mmlu", n_boot=50, seed=0)
    assert ci.estimate == 2 and math.isnan(ci.lo) and math.isnan(ci.hi)


def test_layer_summary_states_the_order_only_with_an_interval():
    from depthkit.analyses import mcq

    for n_items, finding in ((12, True), (4, False)):
        r = ranks_frame(n_items=n_items, balanced=True)
        est = mcq.layer_estimates(r, n_boot=50, seed=0)
        acc = mcq.accuracy(r)
        text = ch.layer_summary(est, acc, _prompts(n_items), r, 4, n_boot=50, seed=0)
        assert ("settled answers are 2.0 layers later than collected options" in text) is finding
        # 4 prompts: no interval for the accuracy either, so the task cannot be tested at all, and the text says why
        assert ("**not testable on this model**" in text) is not finding
        assert ("because only 4 prompts kept, fewer than 10, so nothing here has an interval" in text) is not finding
        assert ("is testable on 1 of 1 tasks (mmlu)." in text) is finding
        assert "95%" not in text  # the old ad-hoc formatter


def test_a_task_at_its_majority_baseline_says_nothing_about_reasoning():
    from depthkit.analyses import mcq

    # every gold answer is option 1 and the model always says option 1: 100 % accuracy, 100 % baseline
    r = ranks_frame(n_items=12)
    text = ch.layer_summary(mcq.layer_estimates(r, n_boot=50, seed=0), mcq.accuracy(r), _prompts(12, balanced=False), r, 4,
                            n_boot=50, seed=0)
    assert "majority baseline 100%" in text and "**not testable on this model**" in text
    assert "cannot be tested on mmlu, because accuracy 100 % (95 % CI 74–100 %) does not clear the majority baseline of 100%" in text
    assert "the model gives one answer (option 'B') to 100.0% of the prompts, more than 80%" in text
    assert "testable on 0 of 1 tasks: on this model no task tests it" in text
    assert "later than collected options" not in text
    assert mcq.majority_baseline(_prompts(12)).loc["mmlu"] == 0.5


def test_share_ci_resamples_prompts_and_respects_min_n():
    ci = ch.share_ci(0.5, 40, n_boot=200, seed=0)
    assert ci.estimate == pytest.approx(0.5) and ci.lo < 0.5 < ci.hi and ci.n == 40
    small = ch.share_ci(0.5, 4, n_boot=200, seed=0)
    assert math.isnan(small.lo) and small.n == 4


def test_the_baseline_is_cleared_only_as_printed_in_whole_per_cent():
    from depthkit import stats

    def ci(lo: float) -> stats.CI:
        return stats.CI(0.4, lo, 0.5, 40)

    # 26.4 % prints as 26 %, the baseline's own value; 26.6 % prints as 27 %
    assert not ch.clears_baseline(ci(0.264), 0.26) and ch.clears_baseline(ci(0.266), 0.26)
    assert not ch.clears_baseline(ci(0.9), float("nan")) and not ch.clears_baseline(ci(float("nan")), 0.2)


def sweep_frame(n_pairs: int, switch: int, layers=(0, 2, 4)) -> pd.DataFrame:
    return pd.DataFrame([
        {"pair": i, "layer": layer, "class": "source-option" if layer >= switch else "target-option", "direction": "sst2 → mmlu"}
        for i in range(n_pairs) for layer in layers
    ])


def test_transition_difference_needs_min_n_on_both_sides():
    few = ch.transition_difference(sweep_frame(4, 2), ranks_frame(), "mmlu", n_boot=50, seed=0)
    assert few.estimate == 1 and math.isnan(few.lo)
    many = ch.transition_difference(sweep_frame(12, 2), ranks_frame(), "mmlu", n_boot=50, seed=0)
    assert many.estimate == 1 and many.lo == 1 and many.hi == 1


def test_transition_marks_strip_the_task():
    tr = pd.DataFrame({"direction": ["a → b", "a → b", "random"], "what": [ch.TRANSITION, "lens collection layer (b)", ch.FOLLOWS],
                       "transition_layer": [3.0, 2.0, 5.0]})
    marks = ch.transition_marks(tr)
    assert list(marks["what"]) == [ch.TRANSITION, "lens collection layer"] and list(marks["layer"]) == [3.0, 2.0]


def test_headlines_name_task_and_direction():
    est = pd.DataFrame({"task": ["mmlu", "sst2"], "collection_layer": [4.0, 6.0], "collection_lo": [3.0, np.nan],
                        "collection_hi": [5.0, np.nan], "decision_layer": [20.0, 22.0], "decision_lo": [18.0, np.nan],
                        "decision_hi": [21.0, np.nan], "n": [16, 4]})
    pt = pd.DataFrame({"direction": ["sst2 → mmlu", "sst2 → mmlu", "random sst2 → sst2"],
                       "what": [ch.TRANSITION, "lens collection layer (mmlu)", ch.FOLLOWS],
                       "transition_layer": [12.0, 4.0, 9.0], "lo": [np.nan] * 3, "hi": [np.nan] * 3, "n_pairs": [4.0, np.nan, 4.0]})
    h = ch.headlines(FakeRun({"layer_estimates": est, "patching_transitions": pt}))
    assert list(h.columns) == [*HEADLINE_COLUMNS, "censored"]
    assert h["censored"].isna().all()  # a run saved before censoring was counted
    assert list(h["quantity"]) == ["MCQ options collected (mmlu)", "MCQ answer settled (mmlu)", "MCQ options collected (sst2)",
                                   "MCQ answer settled (sst2)", "patching transition (sst2 → mmlu)"]
    assert list(h["value"]) == [4.0, 20.0, 6.0, 22.0, 12.0] and list(h["n"]) == [16, 16, 4, 4, 4]
    assert set(h["scale"]) == {"layer"} and h["quantity"].is_unique


def test_paper_rows():
    assert list(ch.PAPER.columns) == PAPER_COLUMNS
    assert ch.PAPER.set_index("quantity").loc["MCQ options collected", "hi"] == 0.5
    assert ch.PAPER.set_index("quantity").loc["MCQ answer settled", "lo"] == 0.5


def _control_frames(sym_collection: float = np.nan, sym_peak: float = 0.0, sym_acc: float = 0.5, orig_collection: float = 28.0):
    est = pd.DataFrame({"variant": ["original", "symbols"], "collection_layer": [orig_collection, sym_collection],
                        "collection_lo": [np.nan] * 2, "collection_hi": [np.nan] * 2, "peak_collected_share": [1.0, sym_peak],
                        "decision_layer": [30.0, 25.0], "decision_lo": [29.0, np.nan], "decision_hi": [30.0, np.nan]})
    acc = pd.DataFrame({"variant": ["original", "symbols"], "accuracy": [0.25, sym_acc], "n": [40, 40],
                        "majority_baseline": [0.3, 0.3], "top1_option": [0.9, 0.05]})
    return est, acc


def test_control_summary_words_missing_and_measured_layers():
    est, acc = _control_frames()
    text = ch.control_summary(est, acc, "mmlu", 30, n_boot=200, seed=0)
    assert "collection layer: never reached, original: layer 28 of 30 (interval cannot be measured" in text
    # a decision layer at L = 30 is the output row: "not before the output", never "layer 30 of 30"
    assert "original: the output, not before (95 % CI from layer 29)" in text
    assert "accuracy 50 % (95 % CI 38–68 %) against a majority baseline of 30% (original 25 % (95 % CI" in text
    assert "of 30 (95 % CI 29–30)" not in text and "layer 30 of 30" not in text
    assert ch.control_summary(est.iloc[:1], acc.iloc[:1], "mmlu", 30, n_boot=200, seed=0) == "No controls were requested."


def test_symbol_control_is_read_from_its_numbers():
    def read(**kw) -> str:
        est, acc = _control_frames(**kw)
        return ch.symbol_reading(est, acc, 30, n_boot=200, seed=0)

    # symbols never collected, and the model cannot use them (accuracy at its baseline): the control cannot separate
    no_use = read(sym_acc=0.3)
    assert "relabelled with rare symbols they never do, at any layer (peak 0%)" in no_use
    assert "finds options only when their label tokens are ordinary, frequent tokens" in no_use
    assert "Nor does the run show the model mapping the symbols onto the options" in no_use and "cannot separate" in no_use
    assert "one of the symbols for 5% of prompts" in no_use and "neither variant shows the options being used" in no_use
    # never collected, yet answered above the baseline: collection tracks frequent tokens, not recognised options
    used = read(sym_acc=0.6)
    assert "chooses among the symbols better than its baseline" in used and "cannot separate" not in used
    assert "tracks frequent label tokens rather than recognised options" in used
    # collected with symbols too: no claim that it depends on frequent tokens, and no unpaired direction
    kept = read(sym_collection=12.0, sym_peak=0.4, sym_acc=0.6)
    assert "still reach the top-|O| for up to 40% of prompts (original 100%)" in kept and "not frequent ones" in kept
    assert "ordinary, frequent tokens" not in kept and "not tested here" in kept
    assert "says nothing here" in read(orig_collection=np.nan)
    assert ch.symbol_reading(*(f.iloc[:1] for f in _control_frames()), 30, n_boot=200, seed=0) == ""


def _gate_frames(one_answer: float, agreement: float = 0.9, n: int = 40, sets: int = 0):
    est = pd.DataFrame({"task": ["sst2"], "collection_layer": [5.0], "demo_sets": [sets]})
    acc = pd.DataFrame({"task": ["sst2"], "n": [n], "accuracy": [0.9], "majority_answer": [0], "majority_share": [one_answer]})
    prompts = pd.DataFrame({"task": "sst2", "options": [(" negative", " positive")] * n, "gold": [i % 2 for i in range(n)]})
    exits = pd.DataFrame({"task": ["sst2"], "layer": [29], "agreement": [agreement]})
    return est, acc, prompts, exits


def test_testability_gates_one_answer_lens_and_size():
    def why(*args, **kw) -> pd.Series:
        est, acc, prompts, exits = _gate_frames(*args, **kw)
        return ch.testability(est, acc, prompts, exits=exits, n_blocks=30, n_boot=200, seed=0).iloc[0]

    assert why(0.8)["testable"] and why(0.8)["why"] == ""  # 80 % is the limit, not over it
    r = why(0.945)
    assert not r["testable"] and r["why"] == ("the model gives one answer (option 'negative') to 94.5% of the prompts, more than "
                                              "80%, so a 'settled' layer marks where that answer takes the lead, not where the task is solved")
    lens = why(0.5, agreement=0.4)
    assert not lens["testable"] and "the lens agrees with the model at layer L−1 on 40% of the prompts, below 50%" in lens["why"]
    few = why(0.5, sets=4)
    assert not few["testable"] and few["why"].startswith("only 4 demonstration sets kept, fewer than 10")
    assert ch.ONE_ANSWER_MAX == 0.8 and ch.LENS_FLOOR == 0.5


def test_patching_summary_without_a_control_says_why():
    sweep = pd.DataFrame({"pair": [0, 0, 1, 1] * 6, "layer": [0, 5] * 12, "class": ["target-option", "source-option"] * 12,
                          "direction": ["sst2 → mmlu"] * 24, "control": [False] * 24, "follows": ["target"] * 24})
    sweep["pair"] = np.repeat(np.arange(12), 2)
    sweep.attrs["control_answers"] = {"task": "sst2", "n": 50, "distinct": 1}
    tr = ch.transitions(sweep, pd.DataFrame({"task": ["mmlu"], "collection_layer": [3.0]}), n_boot=50, seed=0)
    assert ch.FOLLOWS not in set(tr["what"])
    text = ch.patching_summary(tr, sweep, ranks_frame(n_layers=6), 5, n_boot=50, seed=0)
    assert "cannot be measured here" in text and "same answer to all 50 sst2 prompts" in text
    # the transition only at the output (5): its gap to the collection layer is a bound, not an interval
    assert "patching transitions are at least 4 layers later" in text and "only at the output, so the gap is a bound" in text
    assert "CI +4 to +4" not in text


def test_headlines_carry_the_share_of_resamples_at_the_output():
    from depthkit.analyses import mcq

    # the answer settles only at the last layer (4) for every prompt: censored in every resample
    est = mcq.layer_estimates(ranks_frame(n_items=12, decide_at=4), n_boot=50, seed=0)
    assert est["decision_layer"].iloc[0] == 4 and est["decision_censored_share"].iloc[0] == 1.0
    pt = pd.DataFrame({"direction": ["a → b"], "what": [ch.TRANSITION], "transition_layer": [2.0], "lo": [1.0], "hi": [3.0],
                       "n_pairs": [12.0], "censored_share": [0.0]})
    h = ch.headlines(FakeRun({"layer_estimates": est, "patching_transitions": pt})).set_index("quantity")
    assert h.loc["MCQ answer settled (mmlu)", "censored"] == 1.0 and h.loc["MCQ options collected (mmlu)", "censored"] == 0.0
    assert h.loc["patching transition (a → b)", "censored"] == 0.0
    text = ch.layer_summary(est, mcq.accuracy(ranks_frame(n_items=12, decide_at=4)), _prompts(12, balanced=False),
                            ranks_frame(n_items=12, decide_at=4), 4, n_boot=50, seed=0)
    assert "answer settled at the output, not before (in 100 % of resamples)" in text and "of 4 (95 % CI 4–4)" not in text
    # both percentiles on layer 1 of the grid: the share of resamples there, not "95 % CI 1–1"
    assert "options collected at layer 1 of 4 in 100 % of resamples (grid: 1 layer)" in text


def test_an_order_with_the_answer_only_at_the_output_is_a_bound_not_an_interval():
    from depthkit.analyses import mcq

    # balanced answers (testable), options collected at layer 1, the answer only at the output (4)
    r = ranks_frame(n_items=12, decide_at=4, balanced=True)
    est = mcq.layer_estimates(r, n_boot=50, seed=0)
    text = ch.layer_summary(est, mcq.accuracy(r), _prompts(12, balanced=True), r, 4, n_boot=50, seed=0)
    assert "**testable**" in text
    assert "settled answers are at least 3.0 layers later than collected options" in text
    assert "only at the output, so the gap is a bound" in text and "CI +3.0 to +3.0" not in text


def _with_sets(r: pd.DataFrame, sets: int) -> pd.DataFrame:
    return r.assign(demo_set=(r["item"] % sets).map(lambda k: f"set {k}"))


def test_demonstration_sets_are_the_resampled_unit():
    from depthkit.analyses import mcq

    # prompts 0..19 settle at layer 3, prompts 20..39 at layer 1 (balanced=False: one answer per prompt)
    r = pd.concat([ranks_frame(n_items=20, decide_at=3), ranks_frame(n_items=20, decide_at=1).assign(item=lambda f: f["item"] + 20)], ignore_index=True)
    one = mcq.layer_estimates(r.assign(demo_set="only"), n_boot=300, seed=0).iloc[0]
    assert one["demo_sets"] == 1
    assert "intervals cover prompt variation only" in ch.demo_note(one)
    # 10 sets, each holding prompts of one kind: resampling sets sees fewer independent draws than resampling prompts
    clustered = mcq.layer_estimates(r.assign(demo_set=(r["item"] // 4).astype(str)), n_boot=300, seed=0).iloc[0]
    assert clustered["demo_sets"] == 10 and "resample its 10 demonstration sets" in ch.demo_note(clustered)
    assert clustered["n"] == 40
    units = ch._units(r.assign(demo_set=(r["item"] // 4).astype(str)), "mmlu")
    assert len(set(units)) == 10 and ch._units(r.assign(demo_set="only"), "mmlu") is None
    # a set with fewer than MIN_N units gives no interval, whatever the number of prompts
    few = mcq.layer_estimates(_with_sets(ranks_frame(n_items=40), 5), n_boot=50, seed=0).iloc[0]
    assert few["demo_sets"] == 5 and np.isnan(few["decision_lo"])


def test_transition_difference_resamples_pairs_with_their_lens_prompts():
    # pair j is lens prompt j: resampled jointly, the difference is the same in every resample here
    ci = ch.transition_difference(sweep_frame(12, 2), ranks_frame(), "mmlu", n_boot=50, seed=0)
    assert ci.n == 12 and ci.lo == ci.hi == 1
    # clustered by demonstration set: n counts sets, and fewer than MIN_N sets give no interval
    few_sets = ch.transition_difference(sweep_frame(12, 2), _with_sets(ranks_frame(), 4), "mmlu", n_boot=50, seed=0)
    assert few_sets.n == 4 and math.isnan(few_sets.lo)


def test_a_users_file_is_a_patching_source_under_its_name(tiny_llama, tmp_path):
    import json

    from depthkit.analyses import mcq

    path = tmp_path / "my_quiz.jsonl"
    recs = [{"prompt": "The cat sat on the", "options": [" the", " cat"], "answer": 0},
            {"prompt": "The dog lay by", "options": [" the", " cat"], "answer": 1}]
    path.write_text("\n".join(json.dumps(r) for r in recs))
    mine = mcq.add_option_ids(tiny_llama, mcq.load_mcq_file(path))
    other = mcq.add_option_ids(tiny_llama, pd.DataFrame({
        "task": "other", "example": [0, 1, 2], "prompt": ["Water boils at", "The sky is", "A dog and a"],
        "options": [[" the", " door"]] * 3, "gold": [1, 0, 1]}))
    prompts = pd.concat([mine, other], ignore_index=True)
    L = tiny_llama.cfg.n_layers
    p = {"patch_source": "my_quiz", "patch_target": "other", "patch_control": "my_quiz", "n_pairs": 5,
         "patch_layer_step": L, "seed": 0}
    sweep = ch.patching_sweeps(tiny_llama, prompts, p, L)
    main = sweep[~sweep["control"]]
    assert set(main["direction"]) == {"my_quiz → other", "other → my_quiz"}
    # The file holds two prompts: two pairs per direction, not n_pairs.
    assert main.groupby("direction")["pair"].nunique().eq(2).all()


def test_early_exits_are_read_canonically_under_the_authors_convention(tiny_llama):
    from depthkit.analyses import mcq

    prompts = mcq.add_option_ids(tiny_llama, pd.DataFrame({
        "task": "t", "example": [0, 1], "prompt": ["The cat sat on the", "Water boils at"],
        "options": [[" the", " door"]] * 2, "gold": [0, 1]}))
    _, authors = mcq.option_ranks(tiny_llama, prompts, lens="logit", convention="authors", return_trajectories=True, progress=False)
    _, canonical = mcq.option_ranks(tiny_llama, prompts, lens="logit", return_trajectories=True, progress=False)
    with pytest.raises(ValueError, match="pass model, prompts and lens"):
        ch.early_exits(authors)
    pd.testing.assert_frame_equal(ch.early_exits(authors, tiny_llama, prompts, "logit"), ch.early_exits(canonical))


def test_with_both_layers_at_the_output_no_order_is_bootstrapped(monkeypatch):
    from depthkit.analyses import mcq
    from depthkit.chapters import ch02_testability

    # options collected and the answer settled only at the output (4) on a testable task
    r = ranks_frame(n_items=12, collect_at=4, decide_at=4, balanced=True)
    est = mcq.layer_estimates(r, n_boot=50, seed=0)
    monkeypatch.setattr(ch02_testability, "order_difference", lambda *a, **k: pytest.fail("nothing to measure"))
    text = ch.layer_summary(est, mcq.accuracy(r), _prompts(12, balanced=True), r, 4, n_boot=50, seed=0)
    assert "cannot be measured here: both are reached only at the output" in text
    # ... and the task is not counted as testing the claim, whose count chapter 07's verdict agrees with
    assert "testable on 0 of 1 tasks" in text and "**passes the conditions, but no order can be measured**" in text
    assert "mmlu passes the conditions, but there both the options and the answer are reached only at the output" in text
