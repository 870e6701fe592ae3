"""dk.explore: the explorer's state gives the right tables, and its widget shows
messages instead of raising. Checked against the trajectory engine and against the
model's own logits, on the tiny random Llama (seconds, no browser)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import depthkit as dk
from depthkit.lens.base import TunedLens
from depthkit.lens.store import lens_path, save_lens
from depthkit.lens.training_data import resolve_config
from depthkit.lens.trajectories import Item
from depthkit.plots.explorer import Explorer, ExplorerInputError, ExplorerWidget, explore

PROMPT = "The capital of France is"


@pytest.fixture
def widget(tiny_llama) -> ExplorerWidget:
    return explore(tiny_llama, prompt=PROMPT)


@pytest.fixture(scope="module")
def tuned(tiny_llama) -> TunedLens:
    """A tuned lens that is clearly not the logit lens (random translators)."""
    lens = TunedLens(tiny_llama)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        lens.A.copy_(0.3 * torch.randn(lens.A.shape, generator=g))
        lens.b.copy_(0.3 * torch.randn(lens.b.shape, generator=g))
    return lens


def _reference(model, prompt: str, **kw) -> dk.Trajectories:
    return dk.trajectories(model, [prompt], positions="all", top_k=10, progress=False, **kw)


def _same_grid(grid: pd.DataFrame, traj: dk.Trajectories) -> None:
    ref = traj.steps.sort_values(["layer", "position"]).reset_index(drop=True)
    assert grid[["layer", "position"]].equals(ref[["layer", "position"]])
    assert (grid["token_id"].to_numpy() == ref["top1_id"].to_numpy()).all()
    assert (grid["token"].to_numpy() == ref["top1_token"].to_numpy()).all()
    np.testing.assert_allclose(grid["prob"], ref["top1_prob"], rtol=1e-5, atol=1e-7)


def test_package_attribute_is_the_function():
    assert dk.explore is explore and "explore" in dk.__all__


def test_grid_is_what_trajectories_gives(widget, tiny_llama):
    ex = widget.explorer
    _same_grid(ex.grid_table(), _reference(tiny_llama, PROMPT))
    assert ex.grid_table()["target_rank"].isna().all()
    # The last layer's top-1 is the model's own prediction at every position.
    with torch.no_grad():
        logits = tiny_llama(torch.tensor([ex.ids]))
    g = ex.grid_table()
    last = g[g["layer"] == tiny_llama.cfg.n_layers].sort_values("position")
    assert last["token_id"].tolist() == logits[0].argmax(-1).tolist()
    assert ex.position == len(ex.ids) - 1
    assert list(g["input_token"].iloc[: len(ex.ids)]) == ex.input_tokens()
    html = widget.grid.value
    assert f'data-positions="{len(ex.ids)}"' in html and 'data-lens="logit"' in html
    assert html.count("<td") == len(g)


def test_topk_follows_the_position_without_rerunning(widget, tiny_llama):
    ex = widget.explorer
    ref = _reference(tiny_llama, PROMPT).topk
    for pos in (len(ex.ids) - 1, 2, 0):
        widget.position_menu.value = pos
        assert ex.position == pos and f'data-position="{pos}"' in widget.detail.value
        t = ex.topk_table()
        want = ref[ref["position"] == pos].sort_values(["layer", "k"]).reset_index(drop=True)
        assert (t["position"] == pos).all() and len(t) == (tiny_llama.cfg.n_layers + 1) * 10
        assert (t["token_id"].to_numpy() == want["token_id"].to_numpy()).all()
        np.testing.assert_allclose(t["prob"], want["prob"], rtol=1e-5, atol=1e-7)
        g = ex.grid_table()
        top1 = t[t["k"] == 1]["token_id"].to_numpy()
        assert (top1 == g[g["position"] == pos]["token_id"].to_numpy()).all()
    assert ex.forward_passes == 1


def test_target_rank_matches_the_engine(widget, tiny_llama):
    ex = widget.explorer
    widget.target_box.value = " Paris"
    tid = tiny_llama.tokenizer(" Paris", add_special_tokens=False)["input_ids"][0]
    assert ex.target_id == tid and "3 tokens" in widget.status.value  # ' Paris' is ' ', 'Par', 'is' here
    n = len(ex.ids)
    item = Item(ex.ids, list(range(n)), {"t": [tid] * n})
    ref = dk.trajectories(tiny_llama, [item], progress=False).target("t").sort_values(["layer", "position"])
    g = ex.grid_table()
    assert g["target_rank"].tolist() == ref["rank"].tolist()
    np.testing.assert_allclose(g["target_prob"], ref["prob"], rtol=1e-5, atol=1e-8)
    # rank 1 exactly where the target is the top-1
    assert ((g["target_rank"] == 1) == (g["token_id"] == tid)).all()
    tt = ex.target_table()
    assert len(tt) == tiny_llama.cfg.n_layers + 1 and (tt["position"] == n - 1).all()
    assert tt["rank"].tolist() == g[g["position"] == n - 1]["target_rank"].tolist()
    widget.colour_buttons.value = "rank"
    assert 'data-colour="rank"' in widget.grid.value and "rank of" in widget.detail.value
    widget.target_box.value = ""  # clearing the target goes back to colouring by probability
    assert ex.target_id is None and ex.colour_by == "prob" and widget.colour_buttons.value == "prob"
    assert ex.target_table().empty and ex.forward_passes == 1


def test_convention_switch(widget, tiny_llama):
    ex = widget.explorer
    canonical = ex.grid_table()
    widget.convention_buttons.value = "authors"
    authors = ex.grid_table()
    L = tiny_llama.cfg.n_layers
    assert sorted(authors["layer"].unique()) == list(range(1, L + 1))
    _same_grid(authors, _reference(tiny_llama, PROMPT, convention="authors"))
    # for the logit lens the conventions differ only by the missing embedding row
    assert authors.equals(canonical[canonical["layer"] >= 1].reset_index(drop=True))
    assert 'data-convention="authors"' in widget.grid.value and ex.forward_passes == 1


def test_lens_switch_to_a_given_tuned_lens(tiny_llama, tuned):
    w = explore(tiny_llama, lens=tuned, prompt=PROMPT)
    ex = w.explorer
    assert ex.lens_name == "tuned" and w.lens_buttons.value == "tuned"
    _same_grid(ex.grid_table(), _reference(tiny_llama, PROMPT, lens=tuned))
    _same_grid(ex.grid_table(), _reference(tiny_llama, PROMPT, lens=tuned))
    tuned_grid = ex.grid_table()
    w.lens_buttons.value = "logit"
    logit_grid = ex.grid_table()
    _same_grid(logit_grid, _reference(tiny_llama, PROMPT))
    L = tiny_llama.cfg.n_layers
    assert not np.allclose(tuned_grid["prob"][tuned_grid["layer"] < L], logit_grid["prob"][logit_grid["layer"] < L])
    assert tuned_grid[tuned_grid["layer"] == L].equals(logit_grid[logit_grid["layer"] == L])  # both read the model's logits
    w.lens_buttons.value = "tuned"
    w.convention_buttons.value = "authors"
    _same_grid(ex.grid_table(), _reference(tiny_llama, PROMPT, lens=tuned, convention="authors"))
    assert ex.forward_passes == 1 and 'data-lens="tuned"' in w.grid.value


def test_saved_lens_by_path_and_by_name(tiny_llama, tuned, tmp_path):
    path = save_lens(tuned, tmp_path / "lens.safetensors")
    w = explore(tiny_llama, lens=str(path), prompt=PROMPT)
    assert w.explorer.lens_name == "tuned" and "⚠" not in w.status.value
    _same_grid(w.explorer.grid_table(), _reference(tiny_llama, PROMPT, lens=tuned))
    # "tuned" by name: the lens saved in the cache for the default budget
    saved = lens_path(tiny_llama, resolve_config("default"))
    save_lens(tuned, saved)
    try:
        w = explore(tiny_llama, prompt=PROMPT)
        w.lens_buttons.value = "tuned"
        assert w.explorer.lens_name == "tuned" and "⚠" not in w.status.value
        _same_grid(w.explorer.grid_table(), _reference(tiny_llama, PROMPT, lens=tuned))
    finally:
        saved.unlink()
        saved.with_suffix(".json").unlink()


def test_tuned_lens_not_saved_says_so_and_keeps_the_logit_lens(widget):
    ex = widget.explorer
    before = widget.grid.value
    widget.lens_buttons.value = "tuned"
    assert "No tuned lens is saved" in widget.status.value and "lens_for" in widget.status.value
    assert ex.lens_name == "logit" and widget.lens_buttons.value == "logit" and widget.grid.value == before
    w = explore(ex.model, lens="tuned")  # asked for up front: a message, not an exception
    assert "No tuned lens is saved" in w.status.value and w.explorer.lens_name == "logit"


def _refused(widget: ExplorerWidget, change, *, says: str) -> None:
    ex = widget.explorer
    before = (widget.grid.value, widget.detail.value, ex.prompt, ex.ids, ex.lens_name, ex.target_id, ex.position)
    change()
    assert says in widget.status.value, widget.status.value
    assert "Traceback" not in widget.status.value
    assert (widget.grid.value, widget.detail.value, ex.prompt, ex.ids, ex.lens_name, ex.target_id, ex.position) == before


def test_bad_inputs_give_messages_and_lose_nothing(tiny_llama, monkeypatch):
    w = explore(tiny_llama, prompt=PROMPT, target="e", max_tokens=20)
    w.position_menu.value = 3
    _refused(w, lambda: setattr(w.prompt_box, "value", "   "), says="text box is empty")
    _refused(w, lambda: setattr(w.prompt_box, "value", "far too long a prompt for twenty tokens"), says="at most 20")
    assert w.prompt_box.value.startswith("far too long")  # the typed text stays, to be shortened
    with pytest.raises(ExplorerInputError, match="outside the prompt"):
        w.explorer.set_position(99)
    with pytest.raises(ExplorerInputError, match="Unknown lens"):
        w.explorer.set_lens("bogus")
    real = w.explorer.tokenizer
    monkeypatch.setattr(w.explorer, "tokenizer", lambda text, **kw: {"input_ids": []} if text == "∅" else real(text, **kw))
    _refused(w, lambda: setattr(w.target_box, "value", "∅"), says="tokenises to nothing")
    monkeypatch.setattr(w.explorer, "_decode", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    _refused(w, lambda: setattr(w.convention_buttons, "value", "authors"), says="Something went wrong (RuntimeError: boom)")
    assert w.explorer.convention == "canonical" and w.convention_buttons.value == "canonical"
    bad = explore(tiny_llama, lens="bogus")
    assert "Unknown lens" in bad.status.value and bad.explorer.lens_name == "logit"


def test_rank_colouring_needs_a_target(widget):
    _refused(widget, lambda: setattr(widget.colour_buttons, "value", "rank"), says="target token first")
    assert widget.colour_buttons.value == "prob"


def test_state_without_a_prompt_and_escaping(tiny_llama):
    w = explore(tiny_llama)
    assert "Type a prompt" in w.status.value and w.grid.value == ""
    ex = Explorer(tiny_llama)
    with pytest.raises(ExplorerInputError, match="Type a prompt"):
        ex.grid_table()
    ex.set_prompt('<b>"x" & y</b>')
    assert ex.forward_passes == 1
    ex.set_prompt('<b>"x" & y</b>')  # the same prompt again (Enter, then Run) does not rerun
    assert ex.forward_passes == 1
    w = explore(tiny_llama, prompt='<b>"x" & y</b>')
    assert "<b>" not in w.grid.value and "&lt;" in w.grid.value


def test_explore_arguments(tiny_llama):
    w = explore(tiny_llama, prompt=PROMPT, convention="authors", target=" Paris", top_k=3)
    ex = w.explorer
    assert ex.convention == "authors" and w.convention_buttons.value == "authors" and ex.target_id is not None
    assert sorted(ex.topk_table()["k"].unique()) == [1, 2, 3] and ex.grid_table()["target_rank"].notna().all()
    bad = explore(tiny_llama, prompt=PROMPT, convention="sideways")
    assert "Unknown layer convention" in bad.status.value and bad.explorer.convention == "canonical"


def test_damaged_saved_tuned_lens_says_which_file(tiny_llama):
    saved = lens_path(tiny_llama, resolve_config("default"))
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_bytes(b"not a lens")
    try:
        w = explore(tiny_llama, prompt=PROMPT)
        w.lens_buttons.value = "tuned"
        assert "saved tuned lens cannot be used" in w.status.value and str(saved.name) in w.status.value
        assert w.explorer.lens_name == "logit" and w.lens_buttons.value == "logit"
    finally:
        saved.unlink()
