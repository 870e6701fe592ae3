"""Generated prose: one interval format, no interval from too few units, and no
difference stated as a finding when its interval includes zero."""

from __future__ import annotations

import math

from depthkit.stats import MIN_N, narrate

LATER = dict(more="later", less="earlier", than="function words", subject="content words")


def test_estimate_share_and_layer_formats():
    assert narrate.estimate(12.34, 10.1, 14.0) == "12.3 (95 % CI 10.1–14.0)"
    assert narrate.share(0.86, 0.825, 0.895) == "86.0 % (95 % CI 82.5–89.5 %)"
    assert narrate.layer(12.4, 10, 14.2, n_blocks=30) == "layer 12 of 30 (95 % CI 10–14)"
    assert narrate.estimate(math.nan) == "—"
    # ends that print alike are no precise interval
    assert narrate.estimate(10.12, 10.08, 10.14) == "10.1 (in at least 95 % of resamples)"
    assert narrate.difference(0.502, 0.501, 0.504, **LATER, digits=2) == (
        "content words are 0.50 layers later than function words (+0.50 in at least 95 % of resamples)")


def test_no_interval_says_so_and_names_the_minimum():
    text = narrate.estimate(3.0)
    assert text.startswith("3.0 (interval cannot be measured here") and str(MIN_N) in text
    assert "cannot be measured here" in narrate.layer(3)


def test_a_difference_is_a_finding_only_when_its_interval_excludes_zero():
    assert narrate.difference(5.4, 4.5, 6.3, **LATER) == "content words are 5.4 layers later than function words (95 % CI +4.5 to +6.3)"
    assert narrate.difference(-5.4, -6.3, -4.5, **LATER).startswith("content words are 5.4 layers earlier than")
    unclear = narrate.difference(2.1, -1.2, 5.8, **LATER)
    assert unclear.startswith("no clear difference") and "later" not in unclear and "earlier" not in unclear
    assert "no finding" in narrate.difference(-1.2, math.nan, math.nan, **LATER)
    assert "cannot be measured" in narrate.difference(math.nan, math.nan, math.nan, **LATER)
    assert not narrate.excludes_zero(0.0, 1.0, digits=1) and narrate.excludes_zero(0.1, 1.0, digits=1)


def test_an_end_that_prints_as_zero_carries_no_finding():
    # judged as printed: "-0.77 to -0.00" does not exclude zero, "-0.770 to -0.003" does
    assert not narrate.excludes_zero(-0.77, -0.0034, digits=2) and narrate.excludes_zero(-0.77, -0.0034, digits=3)
    assert not narrate.excludes_zero(0.004, 0.5, digits=2) and narrate.excludes_zero(0.006, 0.5, digits=2)
    text = narrate.difference(-0.4, -0.77, -0.0034, **LATER, digits=2)
    assert text == "no clear difference between content words and function words (-0.40 layers, 95 % CI -0.77 to -0.00)"
    assert narrate.difference(-0.4, -0.77, -0.006, **LATER, digits=2).startswith("content words are 0.40 layers earlier")
    # a bound (one side only at the output) is judged the same way
    assert narrate.difference(0.3, 0.004, 0.6, **LATER, digits=2, censored="subject").startswith("no clear difference")
    assert "at least 0.30" in narrate.difference(0.3, 0.006, 0.6, **LATER, digits=2, censored="subject")
    assert narrate.above(0.404, 0.40, digits=2) is False and narrate.above(0.406, 0.40, digits=2)
    assert not narrate.above(math.nan, 0.0, digits=2) and narrate.shown(-0.0034, 2) == 0.0


def test_one_whole_unit_is_singular():
    assert narrate.difference(-1, -1, -1, **LATER, digits=0).startswith("content words are 1 layer earlier than")
    assert narrate.difference(1.0, 0.5, 1.5, **LATER).startswith("content words are 1.0 layers later")
    assert "(+1 layer," in narrate.difference(1, -1, 3, **LATER, digits=0)
    assert "2 layers" in narrate.difference(2, 1, 3, **LATER, digits=0)


def test_model_note_names_quantisation_lens_and_convention():
    from types import SimpleNamespace

    info = SimpleNamespace(name="m", n_blocks=30, d_vocab=49152, quantisation="Q4_1", is_quantised=True)
    note = narrate.model_note(info, "tuned", "authors", paper="Pythia-6.9B")
    assert "from Q4_1 weights" in note and "not Pythia-6.9B" in note
    assert "**tuned**" in note and "**authors**" in note and "49,152" in note
    plain = narrate.model_note(SimpleNamespace(**{**info.__dict__, "is_quantised": False}), "logit", "canonical")
    assert "weights not quantised" in plain and "Q4_1" not in plain


def test_a_layer_at_the_output_is_not_before_the_output_never_layer_L_of_L():
    from depthkit.stats import LayerCI

    assert narrate.layer(30, 30, 30, n_blocks=30, censored_share=0.97) == "the output, not before (in 97 % of resamples)"
    assert narrate.layer(30, 24, 30, n_blocks=30, censored_share=0.6) == (
        "the output, not before (in 60 % of resamples; 95 % CI from layer 24)")
    assert narrate.layer(30, n_blocks=30) == "the output, not before"
    assert narrate.layer(25, 22, 30, n_blocks=30) == "layer 25 of 30 (95 % CI 22 to the output)"
    for v, lo, hi in ((30, 30, 30), (30, 24, 30), (29.6, 29, 30)):
        assert "30 of 30" not in narrate.layer(v, lo, hi, n_blocks=30)
    # without n_blocks nothing is known about the output row
    assert narrate.layer(LayerCI(30, 28, 30, 50)) == "layer 30 (95 % CI 28–30)"


def test_a_zero_width_layer_interval_gives_the_share_of_resamples_and_the_grid():
    from depthkit.stats import LayerCI

    assert narrate.layer(1, 1, 1, n_blocks=30, mode_share=0.97) == "layer 1 of 30 in 97 % of resamples (grid: 1 layer)"
    assert narrate.layer(LayerCI(4, 4, 4, 50, 0.9, 2.0), n_blocks=30) == "layer 4 of 30 in 90 % of resamples (grid: 2 layers)"
    assert narrate.layer(3, 3, 3) == "layer 3 in at least 95 % of resamples (grid: 1 layer)"
    # a mean between layers whose interval rounds to one layer keeps a decimal instead
    assert narrate.layer(12.3, 12.1, 12.4, n_blocks=30) == "layer 12.3 of 30 (95 % CI 12.1–12.4)"
    assert narrate.layer(12, 10, 14, n_blocks=30) == "layer 12 of 30 (95 % CI 10–14)"


def test_a_zero_width_difference_is_a_share_of_resamples_on_its_grid_not_an_interval():
    text = narrate.difference(-2, -2, -2, **LATER, digits=0, step=1)
    assert text == "content words are 2 layers earlier than function words (-2 in at least 95 % of resamples, grid: 1 layer)"
    assert "CI" not in text
    assert "CI" not in narrate.difference(0, 0, 0, **LATER) and narrate.difference(0, 0, 0, **LATER).startswith("no clear")


def test_a_difference_with_a_side_at_the_output_is_a_bound():
    assert narrate.at_output(30, 24, 30) == "subject" and narrate.at_output(24, 30, 30) == "than"
    assert narrate.at_output(30, 30, 30) == "both" and narrate.at_output(24, 21, 30) is None
    later = narrate.difference(6, 6, 6, **LATER, step=1, censored="subject")
    assert later.startswith("content words are at least 6.0 layers later than function words") and "a bound" in later
    # The subject's true layer is at least the output: a negative measured gap proves nothing.
    assert narrate.difference(-3, -5, -1, **LATER, censored="subject").startswith("no clear difference")
    earlier = narrate.difference(-3, -5, -1, **LATER, censored="than")
    assert earlier.startswith("content words are at least 3.0 layers earlier") and "function words only at the output" in earlier
    assert narrate.difference(3, 1, 5, **LATER, censored="than").startswith("no clear difference")
    both = narrate.difference(0, 0, 3, **LATER, censored="both")
    assert "cannot be measured here" in both and "no clear" not in both
