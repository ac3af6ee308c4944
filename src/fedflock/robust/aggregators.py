"""Byzantine-robust aggregation rules over the rows of an (n, P) matrix of client updates.

Each rule replaces the weighted mean of FedAvg; they ignore example counts, as in their papers.
"""

from __future__ import annotations

import torch


def coordinate_median(updates: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median (Yin et al. 2018); the mean of the two middle values for even n."""
    return updates.double().quantile(0.5, dim=0).to(updates.dtype) if len(updates) > 1 \
        else updates[0].clone()


def trimmed_mean(updates: torch.Tensor, beta: float) -> torch.Tensor:
    """Coordinate-wise mean after dropping the `beta` fraction largest and smallest values."""
    n = len(updates)
    k = min(int(beta * n), (n - 1) // 2)
    ordered = updates.sort(dim=0).values
    return ordered[k : n - k].double().mean(0).to(updates.dtype)


def krum_scores(updates: torch.Tensor, byzantine: int) -> torch.Tensor:
    """Krum score of each update: the sum of squared distances to its n - f - 2 nearest others."""
    n = len(updates)
    u = updates.double()
    sq = u.pow(2).sum(1)
    dist = (sq[:, None] + sq[None, :] - 2 * u @ u.T).clamp_min(0)
    dist.fill_diagonal_(float("inf"))
    closest = max(1, n - byzantine - 2)
    return dist.sort(dim=1).values[:, : min(closest, n - 1)].sum(1) if n > 1 \
        else torch.zeros(1, dtype=torch.float64)


def multi_krum(updates: torch.Tensor, byzantine: int, selected: int = 1) -> torch.Tensor:
    """Mean of the `selected` updates with the lowest Krum scores (Blanchard et al. 2017);
    `selected=1` is Krum itself."""
    order = krum_scores(updates, byzantine).argsort()
    return updates[order[: max(1, min(selected, len(updates)))]].double().mean(0).to(updates.dtype)
