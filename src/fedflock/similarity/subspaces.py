"""How far apart two clients' data lie, from the per-class bases of their inputs (the `basis`
task: the top p left singular vectors of each class's d x n_c data matrix).

Per class both clients hold, the angle between their subspaces in degrees, by default the
smallest principal angle, arccos of the largest singular value of U_iᵀU_j (PACFL's paper);
`elementwise` takes the smallest arccos |U_iᵀU_j| over pairs of basis vectors (what PACFL's
authors compute; the absolute value because a singular vector's sign is arbitrary). The
clients' distance is the mean of those angles over the classes both hold; a class held by one
client only says nothing about the pair and is left out, and two clients sharing no class are
90° apart (orthogonal: nothing in common).

FedDAG's data similarity (`weighted_subspace_distance`) counts every class either client
holds: 90° where only one holds it, and each class weighted by how much of it the two hold,
log(1 + n_i,c) + log(1 + n_j,c), so that a quantity shift (the same classes in very different
amounts) moves the distance too.
"""

from __future__ import annotations

from typing import Literal

import torch

Angle = Literal["principal", "elementwise"]


def class_angles(a: torch.Tensor, b: torch.Tensor, angle: Angle = "principal") -> torch.Tensor:
    """Angles in degrees between the subspaces of `a` (m, d, p) and `b` (n, d, p), pairwise:
    (m, n). Zero columns (a class with fewer samples than p) add nothing."""
    gram = torch.einsum("idp,jdq->ijpq", a.double(), b.double()).abs()
    cosine = (torch.linalg.matrix_norm(gram, ord=2) if angle == "principal"
              else gram.flatten(2).max(dim=2).values)
    return torch.rad2deg(torch.arccos(cosine.clamp(0.0, 1.0)))


def subspace_distance(bases_a: torch.Tensor, counts_a: torch.Tensor, bases_b: torch.Tensor,
                      counts_b: torch.Tensor, angle: Angle = "principal") -> torch.Tensor:
    """(m, n) distances in degrees between clients with per-class bases (m, C, d, p) and
    (n, C, d, p) and class counts (m, C), (n, C): the mean angle over the classes both hold,
    90 where they share none."""
    total = torch.zeros(len(bases_a), len(bases_b), dtype=torch.float64)
    shared = torch.zeros_like(total)
    for c in range(bases_a.shape[1]):
        both = (counts_a[:, c] > 0).double()[:, None] * (counts_b[:, c] > 0).double()[None, :]
        if both.any():
            total += both * class_angles(bases_a[:, c], bases_b[:, c], angle)
            shared += both
    return torch.where(shared > 0, total / shared.clamp(min=1), torch.full_like(total, 90.0))


def weighted_subspace_distance(bases_a: torch.Tensor, counts_a: torch.Tensor,
                               bases_b: torch.Tensor, counts_b: torch.Tensor,
                               angle: Angle = "principal") -> torch.Tensor:
    """(m, n) distances in degrees (FedDAG): over the classes either client holds, the angle
    between their subspaces (90 where one lacks the class), weighted by
    log(1 + n_i,c) + log(1 + n_j,c); 90 for two clients with no samples at all."""
    log_a, log_b = counts_a.double().log1p(), counts_b.double().log1p()
    total = torch.zeros(len(bases_a), len(bases_b), dtype=torch.float64)
    weight = torch.zeros_like(total)
    for c in range(bases_a.shape[1]):
        has_a, has_b = counts_a[:, c] > 0, counts_b[:, c] > 0
        if not (has_a.any() or has_b.any()):
            continue
        both = has_a.double()[:, None] * has_b.double()[None, :]
        angles = class_angles(bases_a[:, c], bases_b[:, c], angle)
        theta = both * angles + (1 - both) * 90.0
        w = log_a[:, c, None] + log_b[None, :, c]
        total += w * theta
        weight += w
    return torch.where(weight > 0, total / weight.clamp(min=1e-300),
                       torch.full_like(total, 90.0))
