"""Parameter blocks aggregated over different client sets: the server side of partial sharing.

A plan is a list of parts, each a set of coordinates (a mask from `ModelHandle.mask`) with a
weight for every reply: a part's coordinates become the weighted mean of those replies'
updates, a reply of weight 0 left out. FedPer averages the body over every client and keeps
each head to its client; FedDAG's secondary encoder is averaged over a cluster and its
complementary clusters while the rest of the model stays within the cluster. Coordinates in
no part do not move.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedflock.wire import Reply


@dataclass(frozen=True)
class Part:
    """Coordinates (bool, P) and one weight per reply (a reply of weight 0 does not count)."""

    mask: torch.Tensor
    weights: torch.Tensor


def examples(replies: Sequence[Reply]) -> torch.Tensor:
    """The replies' example counts as weights (FedAvg's), 1 each when none has any."""
    counts = torch.tensor([float(r.num_examples) for r in replies], dtype=torch.float64)
    return counts if float(counts.sum()) > 0 else torch.ones(len(replies), dtype=torch.float64)


def blockwise_mean(replies: Sequence[Reply], plan: Sequence[Part]) -> torch.Tensor:
    """The update of one model: per part, the weighted mean of the replies' updates on its
    coordinates; zero on coordinates no part covers, or whose part weighs no reply. Parts must
    not overlap (a coordinate has one rule)."""
    out = torch.zeros_like(replies[0].update)
    covered = torch.zeros(out.shape, dtype=torch.bool)
    for part in plan:
        if bool((covered & part.mask).any()):
            raise ValueError("the parts of an aggregation plan overlap")
        covered |= part.mask
        total = float(part.weights.sum())
        if total <= 0:
            continue
        acc = torch.zeros(int(part.mask.sum()), dtype=out.dtype)
        for reply, weight in zip(replies, part.weights.tolist(), strict=True):
            if weight > 0:
                acc.add_(reply.update[part.mask], alpha=weight / total)
        out[part.mask] = acc
    return out
