"""How a chapter's tables look: a missing value reads as a dash, not "NaN".

A chapter's tables keep NaN where a statistic cannot be measured (too few examples
for an interval, a layer censored at the output, a test that does not apply). The
prose says why; a table cell that reads "NaN" looks like a failed computation
instead. :func:`enable` makes the running IPython shell (JupyterLab, or the kernel
that builds the book) show every DataFrame's HTML with :data:`MISSING` in those
cells. The data, the saved tables and the plain-text form keep NaN.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from depthkit.plots.shell import running_shell

# What a missing value looks like in a rendered table (an em dash).
MISSING = "\u2014"


def frame_html(frame: pd.DataFrame) -> str:
    """``frame`` as the notebook HTML pandas would show, under pandas' own display
    limits (rows, columns, dimensions), with missing values written as :data:`MISSING`."""
    return frame.to_html(
        na_rep=MISSING,
        max_rows=pd.get_option("display.max_rows"),
        max_cols=pd.get_option("display.max_columns"),
        show_dimensions=pd.get_option("display.show_dimensions"),
        notebook=True,
    )


def enable(shell: Any = None) -> None:
    """Show DataFrames in ``shell`` (default: the running IPython shell, if any)
    through :func:`frame_html`. Without a shell this does nothing."""
    shell = running_shell() if shell is None else shell
    if shell is None:
        return
    shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, frame_html)
