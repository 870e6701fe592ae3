"""The explorer's ipywidgets view (:class:`ExplorerWidget`): a VBox of controls
(prompt, lens, layer convention, colouring, position, target) over the HTML
tables. Every user action goes through :meth:`ExplorerWidget._act`, so a refused
input becomes a message and the grid on screen stays the last good one.
"""

from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as widgets

from depthkit.lens.base import CONVENTIONS
from depthkit.plots.explorer_html import _shown, detail_html, grid_html
from depthkit.plots.explorer_state import Explorer, ExplorerInputError

__all__ = ["ExplorerWidget"]


class ExplorerWidget(widgets.VBox):
    """The explorer's controls and views; ``.explorer`` is its :class:`Explorer`."""

    def __init__(self, explorer: Explorer) -> None:
        self.explorer = ex = explorer
        self._syncing = False
        self.prompt_box = widgets.Text(placeholder="Type a prompt and press Enter, e.g. The capital of France is",
                                       continuous_update=False, layout=widgets.Layout(width="70%"))
        self.run_button = widgets.Button(description="Run", button_style="primary", icon="play")
        self.lens_buttons = widgets.ToggleButtons(options=ex.lens_names, value=ex.lens_name, description="lens")
        self.convention_buttons = widgets.ToggleButtons(options=list(CONVENTIONS), value=ex.convention, description="layers")
        self.colour_buttons = widgets.ToggleButtons(options=[("probability", "prob"), ("target rank", "rank")],
                                                    value=ex.colour_by, description="colour")
        self.position_menu = widgets.Dropdown(options=[("(no prompt yet)", 0)], value=0, description="position")
        self.target_box = widgets.Text(placeholder="target token, e.g. ' Paris'", continuous_update=False, description="target")
        self.status, self.grid, self.detail = widgets.HTML(), widgets.HTML(), widgets.HTML()
        for w, cls in ((self.prompt_box, "prompt"), (self.run_button, "run"), (self.target_box, "target"),
                       (self.status, "status"), (self.grid, "grid-view"), (self.detail, "detail-view")):
            w.add_class(f"depthkit-explorer-{cls}")
        super().__init__([widgets.HBox([self.prompt_box, self.run_button]),
                          widgets.HBox([self.lens_buttons, self.convention_buttons]), self.colour_buttons,
                          widgets.HBox([self.position_menu, self.target_box]), self.status, self.grid, self.detail])
        self.add_class("depthkit-explorer")
        on = lambda fn: lambda change: None if self._syncing else self._act(lambda: fn(change["new"]))
        self.prompt_box.observe(on(ex.set_prompt), "value")
        self.run_button.on_click(lambda _: self._act(lambda: ex.set_prompt(self.prompt_box.value)))
        self.lens_buttons.observe(on(ex.set_lens), "value")
        self.convention_buttons.observe(on(ex.set_convention), "value")
        self.colour_buttons.observe(on(ex.set_colour), "value")
        self.position_menu.observe(on(ex.set_position), "value")
        self.target_box.observe(on(ex.set_target), "value")
        self._act(lambda: None)

    def _act(self, action: Callable[[], str | None]) -> None:
        """Run one user action; whatever goes wrong becomes a message, and the
        controls are set back to the state that was kept."""
        note, error = None, None
        self.status.value = '<span style="color:#666">computing…</span>'
        try:
            note = action()
        except ExplorerInputError as err:
            error = str(err)
        except Exception as err:  # noqa: BLE001 - a widget must show, not raise
            error = f"Something went wrong ({type(err).__name__}: {err}). The previous view is kept."
        self._sync_controls()
        self._render(note, error)

    def _sync_controls(self) -> None:
        ex = self.explorer
        self._syncing = True
        try:
            self.lens_buttons.options, self.lens_buttons.value = ex.lens_names, ex.lens_name
            self.convention_buttons.value = ex.convention
            self.colour_buttons.value = ex.colour_by
            if ex.has_prompt:
                labels = [(f"{p}: {_shown(t, 16)}", p) for p, t in enumerate(ex.input_tokens())]
                if list(self.position_menu.options) != labels:
                    self.position_menu.options = labels
                self.position_menu.value = ex.position
        finally:
            self._syncing = False

    def _render(self, note: str | None, error: str | None) -> None:
        ex = self.explorer
        parts = []
        if error:
            parts.append(f'<span class="dk-error" style="color:#b00">⚠ {html.escape(error)}</span>')
        if note:
            parts.append(f'<span class="dk-note">{html.escape(note)}</span>')
        if ex.has_prompt:
            parts.append(f'<span style="color:#666">{len(ex.ids)} tokens, {ex.forward_passes} model run(s); '
                         f"last update {ex.last_seconds * 1000:.0f} ms</span>")
            if error:  # the grid below is still the last good state, not the rejected input
                parts.append(f'<span style="color:#666">showing {ex.prompt[:60]!r}</span>')
            self.grid.value, self.detail.value = grid_html(ex), detail_html(ex)
        elif not error:
            parts.append("Type a prompt and press Enter (or Run) to see the grid.")
        self.status.value = '<div class="dk-status">' + "<br>".join(parts) + "</div>"

