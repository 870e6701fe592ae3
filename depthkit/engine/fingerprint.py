"""A cheap, stable hash of a model's weights, written into every model's info so a
result names the exact checkpoint it came from."""

from __future__ import annotations

import hashlib

import torch


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A cheap, stable hash of the weights: shapes of all tensors plus a strided sample
    of their values. Distinguishes models and checkpoints without hashing gigabytes."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        if not torch.is_tensor(p) or p.numel() == 0:
            continue
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // 64)
        h.update(flat[::step][:64].to(torch.float64).cpu().numpy().tobytes())
    return h.hexdigest()[:16]
