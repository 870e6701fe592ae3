"""Saved tuned lenses: where they live, writing and checked loading, and lenses by
name.

Saved lenses are safetensors weights plus a JSON sidecar in
``<cache>/lenses/<model>/<config-hash>.safetensors|.json`` (cache: env
``DEPTHKIT_CACHE`` or ``~/.cache/depthkit``). Nothing is ever unpickled.

:func:`get_tuned_lens` loads the saved lens of a configuration or trains and saves
one; :func:`resolve_lens`, which the engines call with a lens *name*, only ever
loads: no engine call starts a training run.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from depthkit.core.files import atomic_write
from depthkit.core.files import cache_dir as default_cache_dir
from depthkit.core.results import model_slug
from depthkit.lens.base import TunedLens
from depthkit.lens.training import start_hash, train_tuned_lens
from depthkit.lens.training_data import (
    FORMAT_VERSION,
    Downweight,
    ResidualCache,
    TrainConfig,
    as_texts,
    config_hash,
    resolve_config,
)

if TYPE_CHECKING:
    from depthkit.engine.handle import Model


class LensFileError(ValueError):
    """A saved lens that cannot be used: missing, damaged, not safetensors, or made
    for another model. The message says what is wrong and how to fix it."""



def lens_path(model: Model, cfg: TrainConfig, texts: Sequence[str] | None = None, cache_dir: str | os.PathLike | None = None) -> Path:
    info = model.info
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / "lenses" / model_slug(info.name) / f"{config_hash(cfg, info, texts)}.safetensors"


def save_lens(lens: TunedLens, path: str | os.PathLike) -> Path:
    """Write ``path`` (.safetensors) and its sidecar ``path.with_suffix('.json')``,
    each atomically. The sidecar records the weights file's SHA-256, so a file
    changed or cut short afterwards is recognised on load."""
    from safetensors.torch import save

    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"Save a lens to a .safetensors path, got {path}.")
    info = lens.model.info
    tensors = {"A": lens.A.detach().float().contiguous(), "b": lens.b.detach().float().contiguous()}
    data = save(tensors, metadata={"depthkit": "tuned_lens", "model": info.name, "fingerprint": info.fingerprint})
    meta = dict(lens.meta)
    meta.setdefault("format", FORMAT_VERSION)
    meta.setdefault("model", info.as_dict())
    meta["shapes"] = {k: list(v.shape) for k, v in tensors.items()}
    meta["weights_sha256"] = hashlib.sha256(data).hexdigest()
    atomic_write(path, data)
    atomic_write(path.with_suffix(".json"), json.dumps(meta, indent=1, sort_keys=True).encode())
    lens.meta, lens.path = meta, path
    return path


_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")


def load_lens(model: Model, path: str | os.PathLike) -> TunedLens:
    """Load a saved tuned lens for ``model``, refusing (with :class:`LensFileError`)
    anything that does not fit: a missing or unreadable file, a pickle or zip
    payload, weights that do not match their sidecar (changed or truncated), wrong
    shapes, or a lens trained for another model."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    path = Path(path)
    if path.suffix == ".json":
        path = path.with_suffix(".safetensors")
    fix = f"Delete {path} and {path.with_suffix('.json')} and train the lens again (get_tuned_lens does both)."
    if not path.is_file():
        raise LensFileError(f"No saved lens at {path}. Train one with depthkit.lens.get_tuned_lens(model).")
    data = path.read_bytes()
    if data.startswith(_PICKLE_MAGIC):
        raise LensFileError(
            f"{path} holds a Python pickle / torch.save payload, not safetensors. depthkit never unpickles files "
            f"(that can run arbitrary code). {fix}"
        )
    sidecar = path.with_suffix(".json")
    if not sidecar.is_file():
        raise LensFileError(f"The sidecar {sidecar} of {path} is missing, so the lens cannot be checked. {fix}")
    try:
        meta = json.loads(sidecar.read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as err:
        raise LensFileError(f"The sidecar {sidecar} is not valid JSON ({err}). {fix}") from None
    digest = hashlib.sha256(data).hexdigest()
    if meta.get("weights_sha256") != digest:
        raise LensFileError(
            f"{path} does not match its sidecar (SHA-256 {digest[:12]}… vs {str(meta.get('weights_sha256'))[:12]}…): "
            f"the weights were changed, cut short or belong to another sidecar. {fix}"
        )
    try:
        tensors = load(data)
    except (SafetensorError, ValueError, RuntimeError) as err:
        raise LensFileError(f"{path} is not a readable safetensors file ({err}). {fix}") from None
    info = model.info
    saved = meta.get("model") or {}
    if saved.get("fingerprint") != info.fingerprint or saved.get("name") != info.name:
        raise LensFileError(
            f"{path} is a tuned lens for model {saved.get('name')!r} (weights fingerprint {saved.get('fingerprint')}), "
            f"not for {info.name!r} ({info.fingerprint}). Use a lens trained for this model: "
            f"get_tuned_lens(model) trains and caches one."
        )
    lens = TunedLens(model)
    want = {"A": tuple(lens.A.shape), "b": tuple(lens.b.shape)}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if got != want or {k: tuple(v) for k, v in (meta.get("shapes") or {}).items()} != want:
        raise LensFileError(f"{path} has tensors {got}, this model needs {want}. {fix}")
    for k, v in tensors.items():
        if not torch.isfinite(v).all():
            raise LensFileError(f"{path}: tensor {k} holds NaN or infinite values. {fix}")
    with torch.no_grad():
        lens.A.copy_(tensors["A"])
        lens.b.copy_(tensors["b"])
    lens.meta, lens.path = meta, path
    return lens


def get_tuned_lens(
    model: Model,
    budget: str | Mapping[str, Any] | TrainConfig = "default",
    text: str | Sequence[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    downweight: Downweight = None,
    seed: int | None = None,
    cache: ResidualCache | None = None,
    start: TunedLens | None = None,
) -> TunedLens:
    """A tuned lens for ``model``: the saved one for this model, budget, text,
    down-weighting, seed (and start lens) if there is one, otherwise trained now and saved
    (``<cache>/lenses/<model>/<hash>.safetensors``). A saved file that is damaged
    raises :class:`LensFileError` saying which file to delete. ``cache``: a
    :class:`~depthkit.lens.training_data.ResidualCache` shared by several calls, so that
    lenses trained on the same text and positions (e.g. with and without
    down-weighting) cache the residuals once. ``start``: the lens that a budget with
    ``init="lens"`` ("finetune") continues from; other budgets ignore it."""
    cfg = resolve_config(budget, seed=seed, downweight=downweight, start=start_hash(budget, start))
    texts = as_texts(text)
    path = lens_path(model, cfg, texts, cache_dir)
    if path.exists():
        return load_lens(model, path)
    lens = train_tuned_lens(
        model, texts, cfg, seed=cfg.seed, progress=progress, downweight=cfg.downweight, cache=cache, start=start
    )
    save_lens(lens, path)
    return lens
