"""An interactive lens explorer for JupyterLab: ``dk.explore(model)``.

Type a prompt and see a layer × position grid of the lens's top-1 next-token
guesses, coloured by their probability or by the rank of a target token; switch
between the logit and the tuned lens and between the two layer conventions; pick
a position to see its top-k at every layer and the target's rank there.

:class:`Explorer` (:mod:`~depthkit.plots.explorer_state`) holds the choices and
returns tidy DataFrames; it is tested without a browser. It runs the model once per
prompt, keeping every depth, so a new lens, convention or target never reruns the
model, and a new position or colouring computes nothing. :class:`ExplorerWidget`
(:mod:`~depthkit.plots.explorer_widget`, what :func:`explore` returns) is a VBox
of ipywidgets drawing the tables as plain HTML (:mod:`~depthkit.plots.explorer_html`):
nothing is fetched from the network. Bad input is refused with a message and leaves
the state, and the grid on screen, as they were.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from depthkit.lens.base import Convention, Lens
from depthkit.plots.explorer_html import _shown as _shown
from depthkit.plots.explorer_html import detail_html as detail_html
from depthkit.plots.explorer_html import grid_html as grid_html
from depthkit.plots.explorer_state import COLOURINGS as COLOURINGS
from depthkit.plots.explorer_state import DEFAULT_MAX_TOKENS, Explorer, ExplorerInputError
from depthkit.plots.explorer_state import ColourBy as ColourBy
from depthkit.plots.explorer_widget import ExplorerWidget

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

__all__ = ["Explorer", "ExplorerInputError", "ExplorerWidget", "explore"]


def explore(model: Model, lens: str | os.PathLike | Lens = "logit", *, prompt: str = "", target: str = "",
            convention: Convention = "canonical", top_k: int = 10, max_tokens: int = DEFAULT_MAX_TOKENS) -> ExplorerWidget:
    """An interactive explorer of ``model``'s layers for JupyterLab (display the
    return value; its ``.explorer`` holds the state and tables).

    ``lens``: ``"logit"``, ``"tuned"`` (only if already saved: train it once with
    ``dk.lens_for(model, "tuned")``), a saved ``.safetensors`` path or a Lens.
    A lens that cannot be used leaves the logit lens on, with a message.

    >>> import depthkit as dk
    >>> model = dk.load_model("tiny-llama", seed=0)
    >>> w = dk.explore(model, prompt="The capital of France is")
    >>> type(w).__name__, w.explorer.lens_name, w.explorer.forward_passes
    ('ExplorerWidget', 'logit', 1)
    >>> w.explorer.grid_table().columns.tolist()
    ['layer', 'position', 'input_token', 'token_id', 'token', 'prob', 'target_rank', 'target_prob']
    """
    ex = Explorer(model, "logit", top_k=top_k, max_tokens=max_tokens)
    w = ExplorerWidget(ex)
    if target:
        w.target_box.value = target  # the observers run these
    if prompt:
        w.prompt_box.value = prompt
    # Last, so that a choice that cannot be used leaves its message on screen.
    if convention != ex.convention:
        w._act(lambda: ex.set_convention(convention))
    if not (isinstance(lens, str) and lens == "logit"):
        w._act(lambda: ex.set_lens(lens))
    return w
