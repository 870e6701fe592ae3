"""The explorer's state and computations, without any widget (:class:`Explorer`).

It runs the model once per prompt, keeping every depth
(:func:`~depthkit.engine.capture.collect_residuals`), and decodes with the trajectory
engine's own :func:`~depthkit.lens.trajectories.decode_residuals`, so a new lens,
convention or target never reruns the model, and a new position or colouring
computes nothing. It returns tidy DataFrames, so it is tested without a browser;
input it refuses raises :class:`ExplorerInputError` and leaves the state as it was.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np
import pandas as pd
import torch

from depthkit.engine.capture import Item, collect_residuals
from depthkit.lens.base import CONVENTIONS, Convention, Lens, LogitLens, layer_plan
from depthkit.lens.registry import get_lens, is_lens_path, kind_names
from depthkit.lens.store import lens_path
from depthkit.lens.training_data import resolve_config
from depthkit.lens.trajectories import TokenNames, decode_residuals

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

__all__ = ["COLOURINGS", "DEFAULT_MAX_TOKENS", "Explorer", "ExplorerInputError"]

ColourBy = Literal["prob", "rank"]
COLOURINGS: tuple[str, ...] = ("prob", "rank")
# A grid wider than this is unreadable on a screen, and every column costs a
# vocabulary-sized readout per layer; explore(max_tokens=...) raises it.
DEFAULT_MAX_TOKENS = 64
# Decoded tables kept per prompt, so toggling lens/convention/target back is instant.
_CACHE_ENTRIES = 8


class ExplorerInputError(ValueError):
    """Input the explorer refuses; the message says what to change."""


class _Tables(NamedTuple):
    grid: pd.DataFrame
    topk: pd.DataFrame


class Explorer:
    """The explorer's state and computations, without any widget.

    ``lens``: ``"logit"``, ``"tuned"`` (the tuned lens saved for this model; never
    trained here, as that takes minutes), the path of a saved ``.safetensors`` lens,
    or a :class:`~depthkit.lens.base.Lens` for this model. Setters raise
    :class:`ExplorerInputError` and change nothing when they refuse.
    """

    def __init__(
        self,
        model: Model,
        lens: str | os.PathLike | Lens = "logit",
        *,
        convention: Convention = "canonical",
        top_k: int = 10,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}.")
        self.model = model
        self.tokenizer = model.tokenizer
        self.n_blocks = model.info.n_blocks
        self.top_k = min(int(top_k), model.info.d_vocab)
        self.max_tokens = min(int(max_tokens), int(model.info.n_ctx))
        self._names = TokenNames(self.tokenizer)
        # One entry per registered kind; None until asked for, since a trained kind
        # is read from a file.
        self._lenses: dict[str, Lens | None] = dict.fromkeys(kind_names())
        self._lenses["logit"] = LogitLens(model)
        self.lens_name = "logit"
        self._resid: torch.Tensor | None = None
        self._tables: OrderedDict[tuple, _Tables] = OrderedDict()
        self.convention: Convention = "canonical"
        self.set_convention(convention)
        self.ids: list[int] = []
        self.prompt, self.position, self.target_text = "", 0, ""
        self.target_id: int | None = None
        self.colour_by: ColourBy = "prob"
        self.forward_passes = 0  # how often the model ran: the tests check the caching
        self.last_seconds = 0.0  # time of the last computation, shown in the widget
        if not (isinstance(lens, str) and lens == "logit"):
            self.set_lens(lens)

    # -- choices ---------------------------------------------------------------

    @property
    def lens_names(self) -> list[str]:
        return list(self._lenses)

    @property
    def has_prompt(self) -> bool:
        return self._resid is not None

    def set_prompt(self, text: str) -> None:
        """Run the model on ``text`` (every depth, every position); the position
        moves to the last token, the one whose prediction is the model's answer."""
        if not isinstance(text, str) or not text.strip():
            raise ExplorerInputError("Type a prompt first: the text box is empty.")
        if text == self.prompt and self.has_prompt:
            return  # Enter and a click on Run both arrive for one prompt
        ids = list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
        if not ids:
            raise ExplorerInputError(f"The prompt {text[:40]!r} tokenises to nothing; type some words.")
        if len(ids) > self.max_tokens:
            raise ExplorerInputError(
                f"The prompt is {len(ids)} tokens; the explorer shows at most {self.max_tokens} (a "
                f"wider grid is unreadable and slow). Shorten it, or call dk.explore(model, max_tokens={len(ids)})."
            )
        start = time.perf_counter()
        with torch.inference_mode():
            resid = collect_residuals(self.model, [Item(ids, list(range(len(ids))))])
        self.forward_passes += 1
        self.prompt, self.ids, self._resid = text, ids, resid
        self.position = len(ids) - 1
        self._tables.clear()
        self._current()  # decode now, so the time shown is that of the whole update
        self.last_seconds = time.perf_counter() - start

    def set_lens(self, lens: str | os.PathLike | Lens) -> None:
        """Switch lens; a tuned lens must already be saved (or be given)."""
        if isinstance(lens, Lens):
            if lens.model is not self.model:
                raise ExplorerInputError(f"That {lens.name} lens was made for another model object; build it for this one.")
            name = "custom" if lens.name == Lens.name else lens.name  # a bare Lens subclass keeps the base name
            self._lenses[name] = lens
        elif isinstance(lens, os.PathLike) or (isinstance(lens, str) and is_lens_path(lens)):
            try:
                self._lenses["tuned"] = get_lens(self.model, lens)
            except ValueError as err:  # LensFileError says which file and why
                raise ExplorerInputError(f"Cannot use the lens file: {err}") from None
            name = "tuned"
        elif isinstance(lens, str) and lens in self._lenses:
            name = lens
            if self._lenses[name] is None:
                self._lenses[name] = self._saved_tuned_lens() if name == "tuned" else get_lens(self.model, name)
        else:
            raise ExplorerInputError(
                f"Unknown lens {lens!r}: choose {' or '.join(repr(n) for n in self._lenses)}, "
                "the path of a saved .safetensors lens, or a Lens object."
            )
        self._apply(lens_name=name)

    def _saved_tuned_lens(self) -> Lens:
        # Looked up the way the engines do (get_lens never trains unless told to), so the explorer
        # shows the same lens the chapters' default budget saved.
        if not lens_path(self.model, resolve_config("default")).exists():
            raise ExplorerInputError(
                f"No tuned lens is saved for {self.model.info.name!r} yet, and training one takes minutes, so the "
                "explorer does not start it. Train it once with `lens = dk.lens_for(model, 'tuned')`, then "
                "`dk.explore(model, lens=lens)`; or pass the path of a saved .safetensors lens. Staying on the logit lens."
            )
        try:
            return get_lens(self.model, "tuned")
        except ValueError as err:  # a damaged or foreign file: LensFileError says which and how to fix it
            raise ExplorerInputError(f"The saved tuned lens cannot be used: {err}") from None

    def set_convention(self, convention: str) -> None:
        if convention not in CONVENTIONS:
            raise ExplorerInputError(f"Unknown layer convention {convention!r}; choose {' or '.join(CONVENTIONS)}.")
        self._apply(convention=convention)

    def set_position(self, position: int) -> None:
        """Pick the position whose top-k and target rank are detailed (negative:
        counted from the end)."""
        n = len(self.ids)
        if not self.has_prompt:
            raise ExplorerInputError("Run a prompt before picking a position.")
        if not isinstance(position, (int, np.integer)) or not -n <= int(position) < n:
            raise ExplorerInputError(f"Position {position!r} is outside the prompt's {n} tokens (0..{n - 1}).")
        self.position = int(position) % n

    def set_target(self, text: str) -> str | None:
        """Follow the rank of the first token of ``text`` (tokenised as typed: type a
        leading space for a word inside running text); ``""`` clears the target.
        Returns a note when ``text`` is several tokens."""
        if text == "":
            self.target_text, self.target_id = "", None
            self.colour_by = "prob" if self.colour_by == "rank" else self.colour_by
            return None
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise ExplorerInputError(f"The target {text!r} tokenises to nothing; type a word, e.g. ' Paris'.")
        self._apply(target_text=text, target_id=int(ids[0]))
        if len(ids) > 1:
            return f"{text!r} is {len(ids)} tokens; following its first, {self.token(ids[0])!r}."
        return None

    def set_colour(self, colour_by: str) -> None:
        if colour_by not in COLOURINGS:
            raise ExplorerInputError(f"Colour by {colour_by!r}? Choose {' or '.join(COLOURINGS)}.")
        if colour_by == "rank" and self.target_id is None:
            raise ExplorerInputError("Type a target token first to colour the grid by its rank.")
        self.colour_by = colour_by  # type: ignore[assignment]

    # -- tables ----------------------------------------------------------------

    def token(self, token_id: int) -> str:
        return str(self._names(np.array([token_id]))[0])

    def input_tokens(self) -> list[str]:
        return list(self._names(np.array(self.ids, dtype=np.int64))) if self.ids else []

    def grid_table(self) -> pd.DataFrame:
        """One row per (layer, position): the lens's top-1 ``token`` (and id) and its
        ``prob``; ``target_rank``/``target_prob`` of the target (NA without one)."""
        return self._current().grid.copy()

    def topk_table(self, position: int | None = None) -> pd.DataFrame:
        """The top-k (``k`` 1 = top-1) at every layer of one position (default: the
        chosen one)."""
        t = self._current().topk
        return t[t["position"] == self._pos(position)].reset_index(drop=True)

    def target_table(self, position: int | None = None) -> pd.DataFrame:
        """The target's rank (1 = top-1) and probability at every layer of one
        position; empty when there is no target."""
        g = self._current().grid
        g = g[g["position"] == self._pos(position)]
        cols = ["layer", "position", "target_id", "target_token", "rank", "prob"]
        if self.target_id is None:
            return pd.DataFrame(columns=cols)
        out = g[["layer", "position", "target_rank", "target_prob"]].rename(
            columns={"target_rank": "rank", "target_prob": "prob"}
        )
        out.insert(2, "target_id", self.target_id)
        out.insert(3, "target_token", self.token(self.target_id))
        return out[cols].reset_index(drop=True)

    def _pos(self, position: int | None) -> int:
        return self.position if position is None else int(position) % max(1, len(self.ids))

    def _apply(self, **changes: object) -> None:
        """Make ``changes`` only if their tables can be computed: a failure keeps the old state."""
        old = {k: getattr(self, k) for k in changes}
        self.__dict__.update(changes)
        try:
            self._timed_decode()
        except BaseException:
            self.__dict__.update(old)
            raise

    def _timed_decode(self) -> None:
        if self.has_prompt:
            start = time.perf_counter()
            self._current()
            self.last_seconds = time.perf_counter() - start

    def _current(self) -> _Tables:
        if self._resid is None:
            raise ExplorerInputError("Type a prompt and press Enter (or Run) to see the grid.")
        key = (self.lens_name, self.convention, self.target_id)
        tables = self._tables.get(key)
        if tables is None:
            tables = self._tables[key] = self._decode()
            while len(self._tables) > _CACHE_ENTRIES:
                self._tables.popitem(last=False)
        self._tables.move_to_end(key)
        return tables

    def _decode(self) -> _Tables:
        lens = self._lenses[self.lens_name]
        assert lens is not None and self._resid is not None  # set_lens resolved it
        plan = layer_plan(self.n_blocks, self.convention)
        n = len(self.ids)
        extra = None if self.target_id is None else torch.full((n, 1), self.target_id, dtype=torch.long)
        # The residuals hold every depth 0..L in order, so plan depths index them directly.
        dec = decode_residuals(lens, plan, self._resid, extra, top_k=self.top_k)
        layers = np.array([s.layer for s in plan], dtype=np.int64)
        n_steps, k = len(plan), self.top_k
        layer = np.repeat(layers, n)
        position = np.tile(np.arange(n, dtype=np.int64), n_steps)
        top_ids = dec.top_ids.reshape(-1, k).cpu().numpy().astype(np.int64)
        top_probs = dec.top_probs.reshape(-1, k).cpu().numpy()
        # Rows come out layer by layer, position by position: already the tables' order.
        grid = pd.DataFrame(
            {
                "layer": layer,
                "position": position,
                "input_token": np.tile(np.array(self.input_tokens(), dtype=object), n_steps),
                "token_id": top_ids[:, 0],
                "token": self._names(top_ids[:, 0]),
                "prob": top_probs[:, 0],
            }
        )
        if extra is None:
            grid["target_rank"] = pd.array([pd.NA] * len(grid), dtype="Int64")
            grid["target_prob"] = np.nan
        else:  # column 0 of the decoder's targets is always the final top-1; ours is column 1
            grid["target_rank"] = pd.array(dec.target_rank[..., 1].reshape(-1).cpu().numpy(), dtype="Int64")
            grid["target_prob"] = dec.target_prob[..., 1].reshape(-1).cpu().numpy()
        topk = pd.DataFrame(
            {
                "layer": np.repeat(layer, k),
                "position": np.repeat(position, k),
                "k": np.tile(np.arange(1, k + 1, dtype=np.int64), len(layer)),
                "token_id": top_ids.reshape(-1),
                "token": self._names(top_ids.reshape(-1)),
                "prob": top_probs.reshape(-1),
            }
        )
        return _Tables(grid, topk)
