"""Pairwise cosine similarity of client updates, one matrix product."""

from __future__ import annotations

import torch


def cosine_matrix(updates: torch.Tensor, other: torch.Tensor | None = None) -> torch.Tensor:
    """Cosine similarity of the rows of `updates` (M, d) with those of `other` (default: itself).

    A zero row has similarity 0 with everything (it carries no direction).
    """
    a = _unit(updates)
    b = a if other is None else _unit(other)
    sim = (a @ b.T).clamp_(-1.0, 1.0)
    if other is None:
        nonzero = updates.norm(dim=1) > 0
        sim.diagonal().copy_(nonzero.double())
    return sim


def _unit(rows: torch.Tensor) -> torch.Tensor:
    rows = rows.double()
    return rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-300)
