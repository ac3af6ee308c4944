"""Communities of a weighted client graph with Louvain (Blondel et al. 2008).

The graph comes from a similarity or distance matrix: cosine similarities keep their positive
part (opposed or orthogonal updates share no edge); distances become the self-tuning affinity
exp(-d_ij^2 / (s_i s_j)), s_i the distance from i to its 7th nearest neighbour (Zelnik-Manor and
Perona 2004), which needs no scale. Two backends give the same method: NetworkX's
`louvain_communities` (pure Python) and igraph's `community_multilevel` (C, much faster on
large dense graphs; see `benchmarks/incremental_scale.py`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedflock.registry import Registry

SELF_TUNING_NEIGHBOUR = 7


@dataclass
class Communities:
    parts: list[list[int]]  # row indices of each community, largest first
    modularity: float
    cross_ratio: float  # mean edge weight between communities / mean weight within them


def affinity(values: np.ndarray, is_similarity: bool) -> np.ndarray:
    """Non-negative symmetric edge weights with a zero diagonal; NaN (unknown pairs) -> 0."""
    values = np.asarray(values, dtype=np.float64)
    known = ~np.isnan(values)
    np.fill_diagonal(known, False)
    if is_similarity:
        weights = np.where(known, np.clip(values, 0.0, None), 0.0)
    else:
        dist = np.where(known, values, np.inf)
        k = min(SELF_TUNING_NEIGHBOUR, max(len(values) - 1, 1))
        scale = np.sort(dist, axis=1)[:, k - 1]
        scale = np.where(np.isfinite(scale), scale, np.nanmax(np.where(known, values, np.nan),
                                                               axis=1, initial=0.0))
        scale = np.clip(scale, 1e-12, None)
        weights = np.where(known, np.exp(-np.where(known, values, 0.0) ** 2
                                          / np.outer(scale, scale)), 0.0)
    weights = (weights + weights.T) / 2
    np.fill_diagonal(weights, 0.0)
    return weights


Backend = Callable[[np.ndarray, float, int], list[set[int]]]
BACKENDS: Registry[Backend] = Registry("community backend")


@BACKENDS.register("networkx", "NetworkX louvain_communities (pure Python)")
def _networkx(weights: np.ndarray, resolution: float, seed: int) -> list[set[int]]:
    import networkx as nx

    graph = nx.from_numpy_array(weights)
    return [set(c) for c in nx.community.louvain_communities(
        graph, weight="weight", resolution=resolution, seed=seed)]


@BACKENDS.register("igraph", "igraph community_multilevel (C)")
def _igraph(weights: np.ndarray, resolution: float, seed: int) -> list[set[int]]:
    import igraph as ig

    rows, cols = np.nonzero(np.triu(weights, 1))
    graph = ig.Graph(n=len(weights), edges=np.column_stack([rows, cols]).tolist())
    ig.set_random_number_generator(random.Random(seed))
    try:
        found = graph.community_multilevel(weights=weights[rows, cols].tolist(),
                                           resolution=resolution)
    finally:
        ig.set_random_number_generator(random)
    return [set(c) for c in found]


def modularity(weights: np.ndarray, parts: list[list[int]], resolution: float = 1.0) -> float:
    """Newman's weighted modularity of a partition (0 for a graph without edges)."""
    total = weights.sum()
    if total <= 0:
        return 0.0
    strength = weights.sum(1)
    q = 0.0
    for part in parts:
        idx = np.asarray(part)
        q += weights[np.ix_(idx, idx)].sum() / total \
            - resolution * (strength[idx].sum() / total) ** 2
    return float(q)


def cross_ratio(weights: np.ndarray, parts: list[list[int]]) -> float:
    """Mean weight of the pairs in different communities over that of pairs in the same one:
    near 0 when communities are really apart, near 1 when Louvain only cut a uniform cloud
    (Louvain always returns some partition; modularity alone cannot tell, being bounded by the
    parts' balance: a 90/10 split scores at most 0.18)."""
    labels = np.empty(len(weights), dtype=int)
    for k, part in enumerate(parts):
        labels[part] = k
    same = labels[:, None] == labels[None, :]
    within = same & ~np.eye(len(weights), dtype=bool)
    if not within.any() or same.all():
        return 1.0 if same.all() else 0.0
    inside = weights[within].mean()
    return float(weights[~same].mean() / inside) if inside > 0 else 1.0


def merge_close(weights: np.ndarray, parts: list[list[int]], max_ratio: float
                ) -> list[list[int]]:
    """Merge communities that are not really apart, closest pair first: two communities stay
    apart only while the mean weight between them is at most `max_ratio` times the mean weight
    within them (a singleton borrows the other's; two singletons the average community's).
    Louvain cuts a uniform cloud into pieces; this puts such pieces back together, while
    communities with (almost) no edge between them, e.g. isolated clients, stay apart."""
    parts = [list(p) for p in parts]
    while len(parts) > 1:
        onehot = np.zeros((len(weights), len(parts)))
        for k, part in enumerate(parts):
            onehot[part, k] = 1.0
        sizes = onehot.sum(0)
        sums = onehot.T @ weights @ onehot  # total weight within (diagonal) and between parts
        pairs_within = sizes * (sizes - 1)
        within = np.where(pairs_within > 0, np.diag(sums) / np.maximum(pairs_within, 1), np.nan)
        typical = float(np.nanmean(within)) if np.isfinite(within).any() else 0.0
        between = sums / np.outer(sizes, sizes)
        best, pair = max_ratio, None
        for a in range(len(parts)):
            for b in range(a + 1, len(parts)):
                inside = np.nanmean([within[a], within[b]]) if np.isfinite(
                    [within[a], within[b]]).any() else typical
                ratio = between[a, b] / inside if inside > 0 else 0.0
                if ratio > best:
                    best, pair = ratio, (a, b)
        if pair is None:
            break
        a, b = pair
        parts[a] = sorted(parts[a] + parts[b])
        del parts[b]
    return sorted(parts, key=lambda p: (-len(p), p[0]))


def louvain(weights: np.ndarray, resolution: float = 1.0, seed: int = 0,
            backend: str = "igraph") -> Communities:
    """Louvain communities of a weighted graph (rows of `weights`), largest first."""
    n = len(weights)
    if n == 0:
        return Communities([], 0.0, 1.0)
    if not (weights > 0).any():  # no edges: no evidence of any grouping
        return Communities([list(range(n))], 0.0, 1.0)
    found = BACKENDS.get(backend)(weights, resolution, seed)
    parts = sorted((sorted(c) for c in found), key=lambda p: (-len(p), p[0]))
    return Communities(parts, modularity(weights, parts, resolution),
                       cross_ratio(weights, parts))
