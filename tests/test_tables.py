"""Rendered tables write a missing value as a dash; the data keep NaN."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from depthkit import plots
from depthkit.plots import tables


def _cells(html: str) -> list[str]:
    return re.findall(r"<td>(.*?)</td>", html)


def test_missing_cells_read_as_a_dash_and_values_are_untouched():
    frame = pd.DataFrame({"layer": [3.0, np.nan], "lo": [np.nan, 0.25], "name": ["a", None]})
    html = tables.frame_html(frame)
    assert "NaN" not in html and "None" not in html
    assert _cells(html) == ["3.0", tables.MISSING, "a", tables.MISSING, "0.25", tables.MISSING]
    # The frame itself is not changed: the dash is only how it is shown.
    assert frame["lo"].isna().tolist() == [True, False]


def test_a_frame_with_nothing_missing_looks_as_pandas_shows_it():
    frame = pd.DataFrame({"layer": [1.5, 2.0], "name": ["a", "b"]})
    assert tables.frame_html(frame) == frame._repr_html_()


def test_pandas_display_limits_still_apply():
    frame = pd.DataFrame({"x": np.arange(500.0)})
    with pd.option_context("display.max_rows", 10, "display.min_rows", 10):
        html = tables.frame_html(frame)
    assert len(re.findall(r"<tr>", html)) < 20
    assert "500 rows" in html


class _Shell:
    """The one part of an IPython shell that :func:`tables.enable` touches."""

    def __init__(self) -> None:
        from IPython.core.formatters import DisplayFormatter

        self.display_formatter = DisplayFormatter()


def test_enable_sets_the_shells_html_but_not_its_plain_text():
    shell = _Shell()
    frame = pd.DataFrame({"lo": [np.nan, 1.5]})
    before, _ = shell.display_formatter.format(frame)
    assert "NaN" in before["text/html"]
    tables.enable(shell)
    after, _ = shell.display_formatter.format(frame)
    assert "NaN" not in after["text/html"] and tables.MISSING in after["text/html"]
    assert "NaN" in after["text/plain"]


def test_plots_enable_turns_the_tables_on(monkeypatch: pytest.MonkeyPatch):
    calls: list[object] = []
    monkeypatch.setattr(tables, "enable", lambda shell=None: calls.append(shell))
    plots.enable(show_bundle=False)
    assert calls == [None]


def test_enable_without_a_shell_does_nothing():
    from IPython import get_ipython

    assert get_ipython() is None
    tables.enable()
