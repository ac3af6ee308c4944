"""How far apart two clients' data lie, from the per-class bases of their inputs (the `basis`
task: the top p left singular vectors of each class's d x n_c data matrix).

Per class both clients hold, the angle between their subspaces in degrees, by default the
smallest principal angle, arccos of the largest singular value of U_iᵀU_j (PACFL's paper);
`elementwise` takes the smallest arccos |U_iᵀU_j| over pairs of basis vectors (what PACFL's
authors compute; the absolute value because a singular vector's sign is arbitrary). The
clients' distance is the mean of those angles over the classes both hold; a class held by one
client only says nothing about the pair and is left out, and two clients sharing no class are
90° apart (orthogonal: nothing in common).
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
