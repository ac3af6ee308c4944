"""Cosine similarity of sparsified updates (FedDAG's gradient similarity): a few coordinates
of each update stand for all of it, which makes the n x n comparison cheap and the updates
sent for it small.

Two ways to choose them: a random mask shared by every client (seeded, the same coordinates
for all: what FedDAG's code does, keeping 2%), or each update's own top-k coordinates by
magnitude (what the paper's summary suggests: the coordinates that moved most). The cosine of
two top-k vectors counts only the coordinates both kept.
"""

from __future__ import annotations

from typing import Literal

import torch

from fedflock.similarity.cosine import cosine_matrix

Sparsify = Literal["random", "topk"]


def kept_count(size: int, keep: float) -> int:
    """How many of `size` coordinates a share `keep` keeps (at least one)."""
    return max(1, min(size, round(keep * size)))


def random_mask(size: int, keep: float, seed: int) -> torch.Tensor:
    """The indices of a seeded random `keep` share of `size` coordinates, sorted: every client
    given the same seed keeps the same ones."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(size, generator=gen)[: kept_count(size, keep)].sort().values


def top_k(updates: torch.Tensor, keep: float) -> torch.Tensor:
    """Each row with only its `keep` share of largest-magnitude coordinates left (rest 0)."""
    k = kept_count(updates.shape[1], keep)
    index = updates.abs().topk(k, dim=1).indices
    return torch.zeros_like(updates).scatter_(1, index, updates.gather(1, index))


def sparse_cosine(updates: torch.Tensor, keep: float, how: Sparsify = "random",
                  seed: int = 0) -> torch.Tensor:
    """(n, n) cosine similarity of the rows of `updates` (n, P), sparsified `how`."""
    if how == "random":
        return cosine_matrix(updates[:, random_mask(updates.shape[1], keep, seed)])
    return cosine_matrix(top_k(updates, keep))
