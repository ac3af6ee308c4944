"""Louvain inside a cluster, on the cosines of updates its members sent in the same round.

Members of one cluster train one model, so the updates of a round differ by data, not by age
(the store incremental clustering first clusters on keeps each client's *latest* update, of
whatever round). `SameRoundCosines` adds up, for every pair of members that replied in the same
round, the cosine of their two updates, and counts those rounds: no communication beyond
FedAvg's, O(m^2) for m members. Under partial participation a pair meets in a few rounds at
most, so the matrix is incomplete; its mean over the rounds both replied in is what
`louvain_split` clusters.

`louvain_split` runs incremental clustering's own rule on that matrix: Louvain communities of
the positive mean cosines, then communities merged back unless they are shown apart (as
`communities.merge_close`, which judges a complete matrix). Shown apart, here, on an
incomplete and noisy matrix: the one-sided upper confidence bound (Student's t at `level`) of
the mean cosine between two communities, over the pairs seen together, must be at most
`max_cross_ratio` times the mean cosine within them. Fewer than two pairs seen between them, or
a mean within that is not positive, show nothing, and the two merge. The raw cosines are
judged, not Louvain's clipped weights: clipping turns a few noisy negative pairs into a zero
with no spread, which looks like proof. So a cluster without groups (between about equal to
within) does not split, while groups whose updates point apart (between about 0) do once
enough pairs have met. The bound uses the pairs' own spread: no scale of the data enters.
Parts smaller than `min_size` are not clusters of their own: their members, and members never
seen beside another, wait for placement like the clients a split window missed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedflock.clustering.communities import affinity, louvain
from fedflock.similarity import cosine_from_gram, gram_matrix

# Members a cluster may have for its pairs to be counted: the sums are O(m^2) (sums and counts
# of two halves, 1000 x 1000 float64 each: 32 MB; at 100,000 members they would take 320 GB).
# Above it the split windows alone examine the cluster.
MAX_MEMBERS = 1000


@dataclass
class SameRoundCosines:
    """Pair sums in two halves, alternate rounds each: communities found on one half are
    judged on the other (a test on the matrix Louvain cut would judge the cut it chose)."""

    clients: list[int] = field(default_factory=list)  # row order of the sums
    total: np.ndarray = field(default_factory=lambda: np.zeros((2, 0, 0)))  # sum of cosines
    count: np.ndarray = field(default_factory=lambda: np.zeros((2, 0, 0)))  # rounds met
    rounds: int = 0  # rounds added (the next goes to half rounds % 2)

    def add(self, clients: list[int], updates: torch.Tensor) -> None:
        """One round's replies of the cluster's members, all computed at its model."""
        if len(clients) < 2:
            return
        index = {c: i for i, c in enumerate(self.clients)}
        new = [c for c in clients if c not in index]
        if new:
            grow = ((0, 0), (0, len(new)), (0, len(new)))
            self.total, self.count = np.pad(self.total, grow), np.pad(self.count, grow)
            for c in new:
                index[c] = len(self.clients)
                self.clients.append(c)
        rows = np.array([index[c] for c in clients])
        cosine = cosine_from_gram(gram_matrix(updates)).numpy()
        half = self.rounds % 2
        self.total[half][np.ix_(rows, rows)] += cosine
        self.count[half][np.ix_(rows, rows)] += 1
        self.rounds += 1

    def mean(self, half: int | None = None) -> np.ndarray:
        """Mean cosine of each pair over the rounds both replied in (NaN: never together),
        in one half of the rounds or in all."""
        total = self.total.sum(0) if half is None else self.total[half]
        met = (self.count.sum(0) if half is None else self.count[half]).copy()
        np.fill_diagonal(met, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(met > 0, total / np.maximum(met, 1), np.nan)

    def state_dict(self) -> dict[str, Any]:
        return {"clients": list(self.clients), "total": self.total, "count": self.count,
                "rounds": self.rounds}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SameRoundCosines:
        return cls([int(c) for c in state["clients"]], np.asarray(state["total"]),
                   np.asarray(state["count"]), int(state["rounds"]))


@dataclass
class LouvainSplit:
    parts: list[list[int]]  # client ids
    figures: dict[str, float]


def apart_ratio(mean: np.ndarray, known: np.ndarray, a: list[int], b: list[int],
                level: float) -> float:
    """How far two communities are from shown apart: the one-sided upper confidence bound
    (Student's t at `level`) of the mean cosine of their pairs seen together, over the mean
    cosine of the pairs seen within the less coherent of the two (each must be closer to
    itself than to the other: a loose community beside a tight one is not apart from it);
    inf when that cannot be judged (fewer than two pairs between, none within one of them, or
    a mean within that is not positive)."""
    from scipy import stats

    between = mean[np.ix_(a, b)][known[np.ix_(a, b)]]
    within = [mean[np.ix_(p, p)][np.triu(known[np.ix_(p, p)], 1)] for p in (a, b)]
    if between.size < 2 or not all(w.size for w in within):
        return float("inf")
    loosest = min(float(w.mean()) for w in within)
    if loosest <= 0:
        return float("inf")
    bound = between.mean() + stats.t.ppf(1 - level, between.size - 1) \
        * between.std(ddof=1) / np.sqrt(between.size)
    return float(bound / loosest)


def merge_unproven(mean: np.ndarray, known: np.ndarray, parts: list[list[int]],
                   max_ratio: float, level: float) -> list[list[int]]:
    """Merge communities, least apart first, until every two left are shown apart
    (`apart_ratio` at most `max_ratio`)."""
    parts = [list(p) for p in parts]
    while len(parts) > 1:
        ratios = {(i, j): apart_ratio(mean, known, parts[i], parts[j], level)
                  for i in range(len(parts)) for j in range(i + 1, len(parts))}
        (i, j), worst = max(ratios.items(), key=lambda item: item[1])
        if worst <= max_ratio:
            break
        parts[i] = sorted(parts[i] + parts[j])
        del parts[j]
    return sorted(parts, key=lambda p: (-len(p), p[0]))


def louvain_split(cosines: SameRoundCosines, max_ratio: float, level: float, min_size: int,
                  resolution: float = 1.0, backend: str = "igraph") -> LouvainSplit | None:
    """The parts (of at least `min_size` members) a cluster splits into on its same-round
    cosines, or None when fewer than two communities are shown apart."""
    if len(cosines.clients) < 2 * min_size:
        return None
    found = louvain(affinity(cosines.mean(0), is_similarity=True), resolution, seed=0,
                    backend=backend)
    if len(found.parts) < 2:
        return None
    mean = cosines.mean(1)  # judged on the other half of the rounds
    known = ~np.isnan(mean)
    merged = merge_unproven(mean, known, found.parts, max_ratio, level)
    kept = [p for p in merged if len(p) >= min_size]
    if len(kept) < 2:
        return None
    ratio = max(apart_ratio(mean, known, a, b, level) for i, a in enumerate(kept)
                for b in kept[i + 1:])
    every = cosines.mean()
    parts = [p for p in nearest_parts(every, kept) if len(p) >= min_size]
    if len(parts) < 2:
        return None
    return LouvainSplit(
        [sorted(cosines.clients[i] for i in part) for part in parts],
        {"cross_ratio": round(ratio, 4),  # the largest bound over within, of the parts kept
         "louvain_communities": len(found.parts),
         "pairs_seen": int((~np.isnan(every)).sum() // 2),
         "pairs": len(every) * (len(every) - 1) // 2,
         "left_to_placement": int(len(every) - sum(len(p) for p in parts))})


def nearest_parts(mean: np.ndarray, parts: list[list[int]]) -> list[list[int]]:
    """Each member of the parts in the part its pairs seen (in all rounds) have the highest mean
    cosine with, when that mean is positive; the others in none (they wait for placement).
    Louvain saw half the rounds: a member with few pairs there can land on the wrong side of
    a cut that is right for the communities as wholes."""
    out: list[list[int]] = [[] for _ in parts]
    for member in sorted(i for part in parts for i in part):
        means = [np.nanmean(mean[member, [j for j in part if j != member]])
                 if np.isfinite(mean[member, part]).any() else np.nan for part in parts]
        if np.isfinite(means).any() and np.nanmax(means) > 0:
            out[int(np.nanargmax(means))].append(member)
    return out
