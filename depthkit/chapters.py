"""The book's chapters: which notebook, what it is called, and the small parameter
set used for smoke runs in CI (the full defaults live in each notebook's
parameters cell)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"


@dataclass(frozen=True)
class Chapter:
    id: str  # two digits, e.g. "01"
    slug: str  # results folder name and notebook stem, e.g. "01_guess_then_refine"
    title: str
    smoke: dict[str, Any] = field(default_factory=dict)

    @property
    def notebook(self) -> Path:
        return NOTEBOOK_DIR / f"{self.slug}.ipynb"


CHAPTERS: dict[str, Chapter] = {
    c.id: c
    for c in [
        Chapter("00", "00_lenses", "Logit lens and tuned lens", smoke={"lens_budget": "smoke", "bias_budget": "smoke", "n_eval": 20}),
        Chapter("01", "01_guess_then_refine", "Guess, then refine", smoke={"n_prompts": 12, "n_boot": 50, "lens_budget": "smoke"}),
        Chapter("02", "02_mcq_collection_vs_reasoning", "Multiple choice: collecting options, then choosing", smoke={"tasks": ["mmlu", "sst2"], "n_examples": 4, "shots": 1, "controls": ["symbols"], "n_pairs": 2, "patch_layer_step": 10, "n_boot": 50, "lens_budget": "smoke"}),
        Chapter("03", "03_fact_recall", "Multi-token fact recall", smoke={"n_examples": 12, "n_trivia": 4, "k_grid": [1, 10, 100], "n_boot": 50, "lens_budget": "smoke"}),
        Chapter(
            "04",
            "04_pos_onset",
            "Part of speech and depth",
            smoke={"n_candidates": 8, "n_per_tag": 4, "max_k": 1000, "k_per_decade": 2, "n_boot": 50, "lens_budget": "smoke"},
        ),
        Chapter("05", "05_residual_phase_change", "A phase change in the residual stream", smoke={"n_texts": 4, "max_tokens": 32, "n_skip_texts": 1, "n_boot": 20, "lens_budget": "smoke"}),
        Chapter("06", "06_depth_score", "Depth scores and early exit", smoke={"n_texts": 4, "max_tokens": 32, "n_verify_texts": 1, "min_group": 3, "n_boot": 20, "lens_budget": "smoke"}),
        Chapter("07", "07_across_models", "Across models", smoke={}),
    ]
}


def chapter(key: str) -> Chapter:
    """Look a chapter up by id ("04") or slug ("04_pos_onset")."""
    key = str(key).strip()
    if key in CHAPTERS:
        return CHAPTERS[key]
    for c in CHAPTERS.values():
        if key == c.slug:
            return c
    raise KeyError(f"No chapter {key!r}. Chapters: {', '.join(f'{c.id} ({c.slug})' for c in CHAPTERS.values())}.")


def available_chapters() -> list[Chapter]:
    """Chapters whose notebook exists, in book order."""
    return [c for c in CHAPTERS.values() if c.notebook.is_file()]
