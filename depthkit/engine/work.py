"""What one forward pass does to the residual stream, said without hooks.

depthkit reads and writes the residual stream at three *sites* per block: its input
(``"pre"``, TransformerLens's ``hook_resid_pre``), the stream between attention and
MLP (``"mid"``, ``hook_resid_mid``) and its output (``"post"``,
``hook_resid_post``). Depth ℓ < L is the site ``(ℓ, "pre")``; depth L is
``(L - 1, "post")``.

A :class:`ForwardWork` lists, for one pass, which rows to read where, which vectors
to write where, and which block's update to remove. It is plain data (ints and
tensors), so every backend (:mod:`depthkit.engine.backends`) can carry it out: the
TransformerLens bridge with hooks, nnsight inside a trace, locally or on a remote
server that has never seen depthkit's code.

At one site the steps run in this order: a removed block's output is replaced by
its input, then vectors are written, then rows are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from jaxtyping import Float, Int
from torch import Tensor

__all__ = ["WHERE", "Call", "Continued", "ForwardWork", "SiteSteps", "depth_site"]

# Sites within a block, in the order the forward pass reaches them.
WHERE = ("pre", "mid", "post")


def _reached(site: tuple[int, str]) -> tuple[int, int]:
    """Sort key of a ``(block, where)`` site: the order a forward pass reaches it."""
    return site[0], WHERE.index(site[1])


def depth_site(depth: int, n_blocks: int) -> tuple[int, str]:
    """The site of residual depth ``depth`` (0..L).

    >>> depth_site(0, 4), depth_site(3, 4), depth_site(4, 4)
    ((0, 'pre'), (3, 'pre'), (3, 'post'))
    """
    if not 0 <= depth <= n_blocks:
        raise ValueError(f"Depth {depth} is outside 0..{n_blocks} (0 = embeddings, {n_blocks} = final residual).")
    return (depth, "pre") if depth < n_blocks else (n_blocks - 1, "post")


@dataclass
class SiteSteps:
    """Everything one pass does at one site, in the order it is done."""

    block: int
    where: str
    skip: bool = False  # replace this block's output by its input ("post" only)
    stash: bool = False  # keep this block's input for a later skip ("pre" only)
    writes: list[tuple[Int[Tensor, " row"], Int[Tensor, " row"], Float[Tensor, "row d_model"]]] = field(default_factory=list)
    reads: list[tuple[str, Int[Tensor, " row"], Int[Tensor, " row"]]] = field(default_factory=list)


@dataclass
class ForwardWork:
    """The reads, writes and removed block of one forward pass (see the module
    docstring). Build it with :meth:`read`, :meth:`write` and :meth:`skip`; backends
    walk :meth:`steps`. A pass returns only what its sites read, so backends end it
    at its last site (:meth:`ends_at_last_site`). ``keep_cache``: also return the
    pass's key/value cache, under :data:`depthkit.engine.contexts.CACHE` (backends
    with ``keeps_cache`` only); such a pass runs every block, so the cache covers
    all of them.

    >>> import torch
    >>> work = ForwardWork().read("h2", (2, "pre"), torch.tensor([0]), torch.tensor([3]))
    >>> [(s.block, s.where, [r[0] for r in s.reads]) for s in work.steps()]
    [(2, 'pre', ['h2'])]
    """

    sites: dict[tuple[int, str], SiteSteps] = field(default_factory=dict)
    keep_cache: bool = False

    def _site(self, site: tuple[int, str]) -> SiteSteps:
        block, where = int(site[0]), str(site[1])
        if where not in WHERE:
            raise ValueError(f"Unknown site {where!r}; choose one of {', '.join(WHERE)}.")
        return self.sites.setdefault((block, where), SiteSteps(block, where))

    def read(self, key: str, site: tuple[int, str], rows: Int[Tensor, " row"], positions: Int[Tensor, " row"]) -> ForwardWork:
        """Read ``h[rows, positions]`` at ``site`` as float32, returned under ``key``."""
        self._site(site).reads.append((key, rows, positions))
        return self

    def write(
        self,
        site: tuple[int, str],
        rows: Int[Tensor, " row"],
        positions: Int[Tensor, " row"],
        vectors: Float[Tensor, "row d_model"],
    ) -> ForwardWork:
        """Write ``vectors`` into ``h[rows, positions]`` at ``site``."""
        self._site(site).writes.append((rows, positions, vectors))
        return self

    def skip(self, block: int) -> ForwardWork:
        """Remove block ``block``'s update: its output becomes its input."""
        self._site((block, "pre")).stash = True
        self._site((block, "post")).skip = True
        return self

    def steps(self) -> list[SiteSteps]:
        """The sites in the order the forward pass reaches them."""
        return [self.sites[k] for k in sorted(self.sites, key=_reached)]

    def ends_at_last_site(self, n_blocks: int) -> bool:
        """Whether a backend may end the pass once its last site is done: nothing after
        that site is read, unless the pass keeps a cache that must cover all
        ``n_blocks`` blocks and the last site comes before the last block's output.

        >>> import torch
        >>> work = ForwardWork().read("h", (1, "pre"), torch.tensor([0]), torch.tensor([0]))
        >>> work.ends_at_last_site(4), ForwardWork(work.sites, keep_cache=True).ends_at_last_site(4)
        (True, False)
        """
        if not self.sites:
            return False
        return not self.keep_cache or max(self.sites, key=_reached) == (n_blocks - 1, "post")

    def keys(self) -> list[str]:
        """The keys of every read, in the order they are done."""
        return [key for s in self.steps() for key, _, _ in s.reads]


class Continued(Protocol):
    """Key/value states a pass continues instead of running their tokens again: a
    :class:`~depthkit.engine.prefix.SharedPrefix` (one prefix for every row) or a
    :class:`~depthkit.engine.contexts.ContextBatch` (one kept context per row)."""

    @property
    def length(self) -> int:
        """Key columns before the pass's own tokens."""
        ...

    def cache_for(self, batch: int) -> Any:
        """The backend's cache object for a pass of ``batch`` rows, which the pass may
        append to."""
        ...


@dataclass
class Call:
    """One forward pass: its inputs and its :class:`ForwardWork`. ``prefix``: the
    key/value states the tokens continue (``attention_mask`` then covers their
    columns too)."""

    tokens: Int[Tensor, "batch seq"]
    attention_mask: Tensor | dict[str, Tensor]
    work: ForwardWork
    position_ids: Int[Tensor, "batch seq"] | None = None
    prefix: Continued | None = None
