"""Permutation masking (CFL paper, Sec. "Privacy"): clients share a secret random orthonormal
transform, here an index permutation, and apply it to everything they send. Cosine similarities,
norms and averages are invariant under it, so the server clusters and aggregates masked vectors
exactly as it would plain ones, without ever seeing an unmasked update.

The permutation maps trainable coordinates among themselves and buffer coordinates among
themselves, so the server still knows which block forms the update.
"""

from __future__ import annotations

import torch

from fedflock.models.flat import FlatSpec


class PermutationMask:
    def __init__(self, spec: FlatSpec, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        head = torch.randperm(spec.num_trainable, generator=g)
        tail = spec.num_trainable + torch.randperm(spec.size - spec.num_trainable, generator=g)
        self.forward = torch.cat([head, tail])
        self.inverse = torch.empty_like(self.forward)
        self.inverse[self.forward] = torch.arange(spec.size)

    def mask(self, vector: torch.Tensor) -> torch.Tensor:
        return vector[..., self.forward]

    def unmask(self, vector: torch.Tensor) -> torch.Tensor:
        return vector[..., self.inverse]
