"""The one split of the book's corpus, decided by each passage's text (so it holds
whatever order or subset a caller takes): tuned lenses train, and hold out, on the
"lens" quarter of the embedded passages; every chapter analyses only the
"analysis" rest. So no chapter evaluates on text a lens was fitted to. Lens
sidecars record the :func:`passage_digest` of their training passages, so any
analysis can check that it avoids them.
"""

from __future__ import annotations

import hashlib

CORPUS_SPLITS = ("all", "lens", "analysis")
LENS_SHARE = 0.25


def passage_digest(text: str) -> str:
    """A short stable name of a passage's text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def corpus_split(text: str) -> str:
    """``"lens"`` or ``"analysis"``: which part of the book's corpus split a passage is in."""
    return "lens" if int(passage_digest(text)[:8], 16) < LENS_SHARE * 16**8 else "analysis"
