"""FedDAG's adaptive fusion of two similarity matrices: each client's row of the fused matrix
A_i = w_i G_i + (1 - w_i) D_i, with w_i in [0, 1] chosen to minimise the entropy of that row's
softmax over the other clients, softmax_j(A_ij / temperature). A low entropy means a few
neighbours stand out; so each client leans on whichever similarity, gradients or data,
separates its neighbours more clearly. The sharpening acts on similarities (higher = closer),
never on distances, which would favour the farthest clients.

The paper learns the weights with a small network trained to minimise the same entropy; a
client's row depends on its w_i alone, so a search over a grid of w finds each minimum
directly, deterministic and without training.
"""

from __future__ import annotations

import torch


def row_entropy(rows: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy of softmax(rows / temperature) over the last dimension, the diagonal of the
    client set excluded (rows (..., n, n), self-similarity masked out)."""
    n = rows.shape[-1]
    logits = (rows / temperature).masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    log_p = torch.log_softmax(logits, dim=-1)
    return -(log_p.exp() * log_p.masked_fill(torch.isinf(log_p), 0.0)).sum(-1)


def fuse_by_entropy(gradient: torch.Tensor, data: torch.Tensor, temperature: float,
                    grid: int = 101) -> tuple[torch.Tensor, torch.Tensor]:
    """(fused (n, n), weights w (n,)) from two similarity matrices (n, n) on the same scale:
    each row's w of the gradient similarity, from `grid` evenly spaced values in [0, 1], the
    one of lowest row entropy (ties: the smallest w). The fused matrix is symmetrised."""
    gradient, data = gradient.double(), data.double()
    ws = torch.linspace(0.0, 1.0, grid, dtype=torch.float64)
    rows = ws[:, None, None] * gradient[None] + (1 - ws[:, None, None]) * data[None]
    weights = ws[row_entropy(rows, temperature).argmin(0)]
    fused = weights[:, None] * gradient + (1 - weights[:, None]) * data
    return (fused + fused.T) / 2, weights
