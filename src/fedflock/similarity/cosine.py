"""Pairwise similarity of client updates from one Gram matrix (a single matrix product).

Everything CFL needs (cosines, norms, the norm of any weighted mean, distances to part means)
is a function of the Gram matrix G = U U^T, so the (M, d) updates are touched once per round and
the rest costs O(M^2).
"""

from __future__ import annotations

import numpy as np
import torch


def gram_matrix(updates: torch.Tensor) -> torch.Tensor:
    """U U^T in float64 (the product itself runs in the updates' dtype, the fast path)."""
    return (updates @ updates.T).double()


def cosine_from_gram(gram: torch.Tensor) -> torch.Tensor:
    """Cosine similarities from a Gram matrix; a zero row has similarity 0 with everything."""
    norms = gram.diagonal().clamp_min(0).sqrt()
    denom = torch.outer(norms, norms)
    sim = torch.where(denom > 0, gram / denom.clamp_min(1e-300), torch.zeros_like(gram))
    sim = sim.clamp(-1.0, 1.0)
    sim.diagonal().copy_((norms > 0).double())
    return sim


def cosine_matrix(updates: torch.Tensor, other: torch.Tensor | None = None) -> torch.Tensor:
    """Cosine similarity of the rows of `updates` (M, d) with those of `other` (default: itself)."""
    if other is None:
        return cosine_from_gram(gram_matrix(updates))
    a, b = _unit(updates), _unit(other)
    return (a @ b.T).clamp_(-1.0, 1.0)


def _unit(rows: torch.Tensor) -> torch.Tensor:
    rows = rows.double()
    return rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-300)


def update_distance(updates: torch.Tensor, other: torch.Tensor, metric: str) -> np.ndarray:
    """(M, N) distances between rows: `euclidean`, or `cosine` (1 - cosine similarity)."""
    if metric == "cosine":
        return (1.0 - cosine_matrix(updates, other)).clamp_min(0.0).numpy()
    return torch.cdist(updates.double(), other.double()).numpy()
