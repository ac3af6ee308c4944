"""Louvain inside a cluster, on the cosines of updates its members sent in the same round.

Members of one cluster train one model, so the updates of a round differ by data, not by age
(the store incremental clustering first clusters on keeps each client's *latest* update, of
whatever round). `SameRoundCosines` adds up, for every pair of members that replied in the same
round, the cosine of their two updates, and counts those rounds: no communication beyond
FedAvg's, O(m^2) for m members. Under partial participation a pair meets in a few rounds at
most, so the matrix is incomplete; its mean over the rounds both replied in is what
`louvain_split` clusters.

`louvain_split` runs incremental clustering's own rule on it, made fit for an incomplete and
noisy matrix. The rounds go to two halves, alternately. On the first, Louvain finds the
communities of the positive mean cosines (members with no pair there left out), and
communities are merged, least apart first, until the rest look apart there. On the second, the
candidate parts are judged: two are shown apart when the one-sided upper confidence bound
(Student's t) of their mean cosine between, over the pairs seen together, is at most
`max_cross_ratio` times the mean cosine within the less coherent of the two, and each one's
mean within is shown positive (its lower bound above 0); fewer than two pairs between or
within show nothing. A split needs every two parts shown apart, at the level shared among the
pairs of parts; a test is due each time the judging half has doubled its pair observations,
and the k-th spends 2^-k of `level`, so all the tests of a cluster together stay within it.
The raw cosines are judged, not Louvain's clipped weights (clipping turns a few noisy negative
pairs into a zero with no spread, which looks like proof), and on the half Louvain and the
merges did not see (on the matrix they cut, the pairs between their communities are the ones
they avoided: noise splits). Then each member joins the part its pairs, in all rounds, have
the highest mean cosine with (a member with few pairs in the first half can land on the wrong
side of a cut that is right for the communities as wholes); parts smaller than `min_size`, and
members with no positive mean to any part, wait for placement like the clients a split window
missed. The bounds use the pairs' own spread: no scale of the data enters. They treat pairs as
independent, which pairs sharing a client are not; the level is one reason to keep it small.
`max_cross_ratio` is the first clustering's bar, on raw same-round cosines here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
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
    looks: int = 0  # tests made so far
    looked_at: float = 0.0  # pair observations in the judging half at the last test

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

    def look(self) -> float | None:
        """The share of the level this test may spend, or None when it is not due: a test is
        due once the judging half holds twice the pair observations of the last one (so a
        cluster watched for N rounds is tested O(log N) times), and the k-th test spends
        2^-k of the level, so all of them together never exceed it."""
        seen = float(np.triu(self.count[1], 1).sum())
        if seen <= 0 or seen < 2 * self.looked_at:
            return None
        self.looks += 1
        self.looked_at = seen
        return 0.5 ** self.looks

    def state_dict(self) -> dict[str, Any]:
        return {"clients": list(self.clients), "total": self.total, "count": self.count,
                "rounds": self.rounds, "looks": self.looks, "looked_at": self.looked_at}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SameRoundCosines:
        # copies: a checkpoint's tensors must not change as the sums grow
        return cls([int(c) for c in state["clients"]],
                   np.asarray(state["total"], dtype=np.float64).copy(),
                   np.asarray(state["count"], dtype=np.float64).copy(), int(state["rounds"]),
                   int(state.get("looks", 0)), float(state.get("looked_at", 0.0)))


@dataclass
class LouvainSplit:
    """The parts a cluster splits into (client ids) and the figures of the decision."""

    parts: list[list[int]]
    figures: dict[str, float]
    clients: list[int]  # the members the decision's matrix shows (the parts' members)
    similarity: np.ndarray  # their mean same-round cosines, all rounds (NaN: never together)


def _t(level: float, n: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(1 - level, n - 1))


def apart_ratio(mean: np.ndarray, known: np.ndarray, a: list[int], b: list[int],
                level: float) -> float:
    """How far two communities are from shown apart: the one-sided upper confidence bound
    (Student's t at `level`) of the mean cosine of their pairs seen together, over the mean
    cosine of the pairs seen within the less coherent of the two (each must be closer to
    itself than to the other: a loose community beside a tight one is not apart from it);
    inf when that cannot be judged: fewer than two pairs between or within either, or a
    within mean not shown positive (its lower bound at `level` at most 0)."""
    between = mean[np.ix_(a, b)][known[np.ix_(a, b)]]
    within = [mean[np.ix_(p, p)][np.triu(known[np.ix_(p, p)], 1)] for p in (a, b)]
    if between.size < 2 or any(w.size < 2 for w in within):
        return float("inf")
    if any(w.mean() - _t(level, w.size) * w.std(ddof=1) / np.sqrt(w.size) <= 0
           for w in within):
        return float("inf")
    bound = between.mean() + _t(level, between.size) * between.std(ddof=1) \
        / np.sqrt(between.size)
    return float(bound / min(w.mean() for w in within))


def merge_unproven(mean: np.ndarray, known: np.ndarray, parts: list[list[int]],
                   max_ratio: float, level: float) -> list[list[int]]:
    """Merge communities, least apart first, until every two left are shown apart
    (`apart_ratio` at most `max_ratio`); a merge re-scores only the pairs it changed."""
    held = {k: sorted(p) for k, p in enumerate(parts)}
    ratio = {(a, b): apart_ratio(mean, known, held[a], held[b], level)
             for a, b in combinations(held, 2)}
    while ratio:
        (a, b), worst = max(ratio.items(), key=lambda item: item[1])
        if worst <= max_ratio:
            break
        held[a] = sorted(held[a] + held.pop(b))
        ratio = {k: v for k, v in ratio.items() if a not in k and b not in k}
        for c in held:
            if c != a:
                x, y = min(a, c), max(a, c)
                ratio[x, y] = apart_ratio(mean, known, held[x], held[y], level)
    return sorted(held.values(), key=lambda p: (-len(p), p[0]))


def louvain_split(cosines: SameRoundCosines, max_ratio: float, level: float, min_size: int,
                  resolution: float = 1.0, backend: str = "igraph") -> LouvainSplit | None:
    """The parts (of at least `min_size` members) a cluster splits into on its same-round
    cosines, or None when fewer than two communities are shown apart. Found on the first half
    of the rounds (Louvain, then communities merged until the rest look apart there, members
    with no pair in it left out); judged on the second: every two parts shown apart at
    `level` shared among the pairs of parts (Bonferroni)."""
    find = cosines.mean(0)
    seen = np.flatnonzero(~np.isnan(find).all(axis=1))
    if len(seen) < 2 * min_size:
        return None
    find = find[np.ix_(seen, seen)]
    found = louvain(affinity(find, is_similarity=True), resolution, seed=0, backend=backend)
    candidates = merge_unproven(find, ~np.isnan(find), found.parts, max_ratio, level) \
        if len(found.parts) > 1 else []
    kept = [[int(seen[i]) for i in p] for p in candidates if len(p) >= min_size]
    if len(kept) < 2:
        return None
    judge = cosines.mean(1)
    pairs = list(combinations(kept, 2))
    ratio = max(apart_ratio(judge, ~np.isnan(judge), a, b, level / len(pairs))
                for a, b in pairs)
    if ratio > max_ratio:
        return None
    every = cosines.mean()
    parts = [p for p in nearest_parts(every, kept) if len(p) >= min_size]
    if len(parts) < 2:
        return None
    rows = sorted(i for p in parts for i in p)
    return LouvainSplit(
        [sorted(cosines.clients[i] for i in part) for part in parts],
        {"apart_ratio": round(ratio, 4),  # the largest, of the parts judged
         "louvain_communities": len(found.parts),
         "judged_parts": len(kept),
         "pairs_seen": int((~np.isnan(every)).sum() // 2),
         "pairs": len(every) * (len(every) - 1) // 2,
         "left_to_placement": int(len(every) - len(rows))},
        [cosines.clients[i] for i in rows], every[np.ix_(rows, rows)])


def nearest_parts(mean: np.ndarray, parts: list[list[int]]) -> list[list[int]]:
    """Each member of the parts in the part its pairs seen (in all rounds) have the highest mean
    cosine with, when that mean is positive; the others in none (they wait for placement).
    Louvain saw half the rounds: a member with few pairs there can land on the wrong side of
    a cut that is right for the communities as wholes."""
    members = np.array(sorted(i for part in parts for i in part))
    known = ~np.isnan(mean[members])  # the diagonal is NaN: a member never counts itself
    onehot = np.zeros((mean.shape[1], len(parts)))
    for k, part in enumerate(parts):
        onehot[part, k] = 1.0
    seen = known @ onehot  # pairs seen with each part
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(seen > 0, np.where(known, mean[members], 0.0) @ onehot / seen, -np.inf)
    best = means.argmax(axis=1)
    out: list[list[int]] = [[] for _ in parts]
    for member, k, top in zip(members, best, means.max(axis=1), strict=True):
        if top > 0:
            out[k].append(int(member))
    return out
