"""The running IPython shell, if any: charts ask whether it is a kernel (their
offline bundle is shown once per kernel), tables register their HTML with it."""

from __future__ import annotations

from typing import Any


def running_shell() -> Any:
    """The running IPython shell (JupyterLab's kernel, the book's, a terminal
    IPython), or None outside IPython or where IPython is not installed."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()
