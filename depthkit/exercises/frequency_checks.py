"""Checks of exercise 01: frequency buckets and the decision flip rate.

The student's functions run on small synthetic data (corpus ranks, a steps table
of a few dozen predictions) that hits every bucket edge and every kind of flip.
Answers are compared with depthkit (:func:`depthkit.analyses.frequency.bucket_of`,
:func:`depthkit.analyses.summaries.flip_rates`) and with a computation written out here in
plain Python; a wrong answer is compared with what the usual mistakes give.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from depthkit.analyses import frequency, summaries
from depthkit.exercises._check import ExerciseError, call, passed, single_threaded

# Ranks either side of every bucket edge, with the bucket each belongs to, by hand.
EDGE_CASES: tuple[tuple[int, str], ...] = (
    (1, "Top 1-10"), (2, "Top 1-10"), (9, "Top 1-10"), (10, "Top 1-10"), (11, "11-100"), (57, "11-100"),
    (99, "11-100"), (100, "11-100"), (101, "101-1000"), (640, "101-1000"), (999, "101-1000"),
    (1000, "101-1000"), (1001, "rest"), (4096, "rest"), (100000, "rest"),
)  # fmt: skip


def _labels(value: Any, n: int) -> np.ndarray:
    __tracebackhide__ = True
    if value is None:
        raise ExerciseError("`frequency_bucket` returned None: did you forget the `return` line?")
    if isinstance(value, str):
        raise ExerciseError("`frequency_bucket` returned one string; return one bucket name per rank (an array).")
    out = np.asarray(list(value), dtype=object)
    if out.shape != (n,):
        raise ExerciseError(f"`frequency_bucket` got {n} ranks and returned {out.shape}; return one bucket name per rank.")
    unknown = sorted({str(x) for x in out} - set(frequency.BUCKETS))
    if unknown:
        raise ExerciseError(
            f"`frequency_bucket` returned bucket names {unknown}; use exactly the book's names "
            f"{list(frequency.BUCKETS)} (dk.frequency.BUCKETS)."
        )
    return out


@single_threaded
def check_frequency_bucket(frequency_bucket: Callable[[np.ndarray], Any]) -> None:
    """Check ``frequency_bucket(ranks) -> bucket names`` at every edge and on random ranks."""
    __tracebackhide__ = True
    ranks = np.array([r for r, _ in EDGE_CASES], dtype=np.int64)
    want = [b for _, b in EDGE_CASES]
    got = _labels(call(frequency_bucket, "frequency_bucket", ranks.copy()), len(ranks))
    wrong = [(int(r), str(g), w) for r, g, w in zip(ranks, got, want) if g != w]
    if wrong:
        order = list(frequency.BUCKETS)
        late = {r for r, g, w in wrong if order.index(g) == order.index(w) + 1}
        if {10, 100, 1000} <= late:
            raise ExerciseError(
                "Ranks 10, 100 and 1000 land one bucket too far: the upper edges are inclusive. Rank 10 is one of "
                "the ten most frequent tokens, so it is in 'Top 1-10' (use `<=`, not `<`)."
            )
        lines = "; ".join(f"rank {r} gave {g!r}, should be {w!r}" for r, g, w in wrong[:4])
        raise ExerciseError(f"Some ranks are in the wrong bucket: {lines}. Ranks start at 1 (the most frequent token).")
    rng = np.random.default_rng(0)
    ranks = np.unique(np.concatenate([rng.integers(1, 2000, 300), rng.integers(1, 200000, 100)]))
    got = _labels(call(frequency_bucket, "frequency_bucket", ranks.copy()), len(ranks))
    ref = frequency.bucket_of(ranks)
    if not (got == ref).all():
        i = int(np.flatnonzero(got != ref)[0])
        raise ExerciseError(f"On random ranks: rank {ranks[i]} gave {got[i]!r}, should be {ref[i]!r}.")
    passed("frequency_bucket is right: every bucket edge (10, 100, 1000) and 400 random ranks agree with dk.frequency.bucket_of.")


# --------------------------------------------------------------------------- flip rates


def _synthetic_steps(seed: int = 0, n_items: int = 40, n_blocks: int = 5, vocab: int = 3000) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A frequency table and a steps table [item, layer, top1_id, bucket] in which
    early layers often guess frequent tokens and later layers settle on the final one,
    so every bucket and every kind of flip occurs."""
    rng = np.random.default_rng(seed)
    counts = np.sort(rng.zipf(1.3, vocab))[::-1].astype(np.int64)
    freq = pd.DataFrame({"token_id": np.arange(vocab), "count": rng.permutation(counts)})
    order = np.lexsort((freq["token_id"], -freq["count"]))
    freq["rank"] = 0
    freq.loc[order, "rank"] = np.arange(1, vocab + 1)
    freq["share"] = freq["count"] / freq["count"].sum()
    by_rank = freq.sort_values("rank")["token_id"].to_numpy()
    rows = []
    for item in range(n_items):
        final = int(by_rank[rng.integers(0, vocab)])
        for layer in range(n_blocks + 1):
            settle = layer == n_blocks or rng.random() < layer / n_blocks
            guess = int(by_rank[rng.integers(0, [10, 100, 1000, vocab][rng.integers(0, 4)])])
            rows.append({"item": item, "layer": layer, "top1_id": final if settle else guess})
    steps = summaries.label_buckets(pd.DataFrame(rows), freq)
    steps["bucket"] = steps["bucket"].astype(str)  # plain strings: no categorical traps for the student
    return freq, steps[["item", "layer", "top1_id", "bucket"]]


def _by_hand(steps: pd.DataFrame, reference: str = "final", per: str = "bucket") -> dict[tuple[int, str], float]:
    """Flip rates in plain Python, and the usual mistakes: ``reference`` "final",
    "layer0" or "next"; ``per`` "bucket" (rate within the bucket), "final_bucket"
    (bucketed by the final token) or "layer" (flips in the bucket over all
    predictions at the layer)."""
    top = {(r.item, r.layer): (r.top1_id, r.bucket) for r in steps.itertuples()}
    last = int(steps["layer"].max())
    flips: dict[tuple[int, str], list[int]] = {}
    per_layer: dict[int, int] = {}
    for (item, layer), (tid, bucket) in top.items():
        ref = {"final": last, "layer0": 0, "next": min(layer + 1, last)}[reference]
        key_bucket = top[(item, last)][1] if per == "final_bucket" else bucket
        flips.setdefault((layer, key_bucket), []).append(int(tid != top[(item, ref)][0]))
        per_layer[layer] = per_layer.get(layer, 0) + 1
    if per == "layer":
        return {k: sum(v) / per_layer[k[0]] for k, v in flips.items()}
    return {k: sum(v) / len(v) for k, v in flips.items()}


def _rates_of(value: Any) -> dict[tuple[int, str], float]:
    __tracebackhide__ = True
    if value is None:
        raise ExerciseError("`flip_rate` returned None: did you forget the `return` line?")
    if isinstance(value, pd.Series) and list(value.index.names) == ["layer", "bucket"]:
        value = value.rename("flip_rate").reset_index()
    if not isinstance(value, pd.DataFrame):
        raise ExerciseError(f"`flip_rate` returned a {type(value).__name__}; return a DataFrame [layer, bucket, flip_rate].")
    missing = [c for c in ("layer", "bucket", "flip_rate") if c not in value.columns]
    if missing == ["bucket"]:
        raise ExerciseError("The result has no `bucket` column: the flip rate is per layer *and* frequency bucket.")
    if missing:
        raise ExerciseError(f"The result lacks column(s) {missing}; it has {list(value.columns)}. Return [layer, bucket, flip_rate].")
    frame = value.dropna(subset=["flip_rate"])  # pairs that never occur, as an unobserved groupby leaves them
    keys = list(zip(frame["layer"].astype(int), frame["bucket"].astype(str)))
    if len(set(keys)) != len(keys):
        raise ExerciseError("The result has several rows for one (layer, bucket); give one rate per pair.")
    return dict(zip(keys, frame["flip_rate"].astype(float)))


def _same(a: dict[tuple[int, str], float], b: dict[tuple[int, str], float]) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-9 for k in a)


@single_threaded
def check_flip_rate(flip_rate: Callable[[pd.DataFrame], Any]) -> None:
    """Check ``flip_rate(steps) -> [layer, bucket, flip_rate]`` on synthetic steps."""
    __tracebackhide__ = True
    freq, steps = _synthetic_steps()
    ref = summaries.flip_rates(steps[["item", "layer", "top1_id"]], freq)
    want = {(int(r.layer), str(r.bucket)): float(r.flip_rate) for r in ref.itertuples()}
    if not _same(want, _by_hand(steps)):
        raise RuntimeError("depthkit's flip rates and the plain computation disagree; report this.")
    got = _rates_of(call(flip_rate, "flip_rate", steps.copy()))
    if _same(got, want):
        passed(
            f"flip_rate is right: all {len(want)} (layer, bucket) rates of {steps['item'].nunique()} synthetic items "
            f"over {steps['layer'].nunique()} layers agree with dk.metrics.flip_rates and with a plain-Python count."
        )
        return
    mistakes = [
        ({k: 1 - v for k, v in want.items()}, "These are agreement rates (layer top-1 = final), i.e. 1 - flip rate. "
                                              "A flip is a layer's top-1 that *differs* from the final prediction."),
        ({k: 100 * v for k, v in want.items()}, "These are percentages; return fractions between 0 and 1."),
        (_by_hand(steps, per="final_bucket"), "You bucketed each prediction by the frequency of the *final* token; "
                                              "the bucket is that of the layer's own top-1 (the `bucket` column)."),
        (_by_hand(steps, reference="layer0"), "You compared every layer with layer 0; compare it with the final "
                                              "prediction, the top-1 at the deepest layer."),
        (_by_hand(steps, reference="next"), "You compared each layer with the next one; a decision flip compares "
                                            "every layer with the final prediction (the deepest layer)."),
        (_by_hand(steps, per="layer"), "You divided by all predictions at the layer; divide by the predictions "
                                       "*in that bucket* at that layer (the rate is within the bucket)."),
    ]
    for values, message in mistakes:
        if _same(got, values):
            raise ExerciseError(message)
    lost, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    if lost:
        raise ExerciseError(f"No rate for {len(lost)} (layer, bucket) pair(s) that occur, e.g. {lost[0]}.")
    if extra:
        raise ExerciseError(f"Rates for pair(s) with no prediction, e.g. {extra[0]}: leave those out.")
    k = next(k for k in want if abs(want[k] - got[k]) >= 1e-9)
    raise ExerciseError(f"Wrong rate at layer {k[0]}, bucket {k[1]!r}: {got[k]:.3f}, should be {want[k]:.3f}.")


def example_steps(n_items: int = 6) -> pd.DataFrame:
    """A small steps table of the kind :func:`check_flip_rate` feeds the student's
    function, to look at before writing it."""
    return _synthetic_steps(seed=1, n_items=n_items)[1]
