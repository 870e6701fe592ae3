"""Statistics for every chapter: one bootstrap, one interval convention.

Convention: a 95 % percentile bootstrap interval, columns ``lo`` and ``hi``,
resampling the independent unit the caller names (a prompt, a passage, a patching
pair), never a finer one (tokens of the same passage are not independent). Where
rows share a unit (examples of one passage, prompts of one set of demonstrations),
``units=`` resamples the units as clusters. No interval is given from fewer than
:data:`MIN_N` units: ``lo``/``hi`` are NaN then, and prose says "cannot be measured
here" (see :mod:`depthkit.stats.narrate`).

Two cases where a percentile interval would claim a precision it does not have:

* a share (a mean of booleans) at 0/n or n/n: every resample repeats it, so the
  interval is the exact binomial (Clopper–Pearson) one, :func:`binomial_bounds`;
* a layer on an integer grid whose resamples put both percentiles on one layer:
  :class:`LayerCI` keeps the share of resamples at that layer and the grid step.

Row L, the model's own output, is censoring for a layer at which something is first
reached: "at L" means "not before the output". :class:`LayerCI` counts the resamples
at L, and :func:`censored_mean` averages only the items reached before it and
reports the share of items that were not.

The modules, one idea each: :mod:`~depthkit.stats.intervals` (the convention and
the exact binomial bounds), :mod:`~depthkit.stats.bootstrap` (the resampling loop),
:mod:`~depthkit.stats.means` (unit and censored means),
:mod:`~depthkit.stats.differences` (matched and adjusted group differences),
:mod:`~depthkit.stats.layers` (a layer with its interval),
:mod:`~depthkit.stats.curves` (curves over layers resampled by item),
:mod:`~depthkit.stats.curve_points` (knees, settling layers, two-segment fits) and
:mod:`~depthkit.stats.narrate` (numbers in words). Every name is re-exported here,
so ``from depthkit.stats import ...`` never needs to know which module holds it.
"""

from __future__ import annotations

# Private helpers too: the tests check them where the one module used to hold them.
from depthkit.stats import narrate  # noqa: F401
from depthkit.stats.bootstrap import _boot_stats, _bootstrap, _clusters, bootstrap_ci, bootstrap_ci_by  # noqa: F401
from depthkit.stats.curve_points import (  # noqa: F401
    SegmentFit,
    first_layer_reaching,
    knee,
    settling_layer,
    two_segment_fit,
)
from depthkit.stats.curves import LayerEstimate, curve_estimate, layer_means, unit_curves  # noqa: F401
from depthkit.stats.differences import (  # noqa: F401
    _stratified_by_unit,
    _unit_draws,
    adjusted_difference,
    stratified_difference,
)
from depthkit.stats.intervals import (  # noqa: F401
    CI,
    LEVEL,
    MIN_N,
    Stat,
    _check,
    _edge_share,
    _nan_quantiles,
    _require,
    binomial_bounds,
    interval,
)
from depthkit.stats.layers import LayerCI, _grid_step, bootstrap_layer, layer_ci  # noqa: F401
from depthkit.stats.means import censored_mean, unit_mean  # noqa: F401
