"""Communities of a weighted client graph with Louvain (Blondel et al. 2008).

The graph comes from a similarity or distance matrix: cosine similarities keep their positive
part (opposed or orthogonal updates share no edge); distances become the self-tuning affinity
exp(-d_ij^2 / (s_i s_j)), s_i the distance from i to its 7th nearest neighbour (Zelnik-Manor and
Perona 2004), which needs no scale. Two backends give the same method: NetworkX's
`louvain_communities` (pure Python) and igraph's `community_multilevel` (C, much faster on
large dense graphs; see `benchmarks/incremental_scale.py`).

A graph is a dense (n, n) array or, for many clients, a SciPy sparse array: the k-nearest-
neighbour graph (`knn_affinity`) of the neighbour lists the incremental store keeps instead of
its n x n matrix. Louvain, modularity, `block_means` and `merge_close` take either; `affinity`
builds a dense graph, `knn_affinity` a sparse one; `cross_ratio` reads `block_means`.

Modularity has a resolution limit (Fortunato and Barthelemy 2007): it joins two communities
whenever the weight between them exceeds what the whole graph's mean weight predicts, so many
small groups get lumped in pairs (7 label-swap groups of 5 clients: 5 communities at
resolution 1). `nested_communities` therefore partitions each community again on its own
subgraph, whose null model is the community's own, and keeps two of its parts apart only on
evidence: a caller's `apart` test (incremental clustering: the split test's cuts of
same-round updates, `separated_share`), else `merge_close`'s ratio. No resolution to tune.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedflock.registry import Registry

SELF_TUNING_NEIGHBOUR = 7


@dataclass
class Communities:
    parts: list[list[int]]  # row indices of each community, largest first
    modularity: float
    cross_ratio: float  # mean edge weight between communities / mean weight within them


def affinity(values: np.ndarray, is_similarity: bool, scale: np.ndarray | None = None
             ) -> np.ndarray:
    """Non-negative symmetric edge weights with a zero diagonal; NaN (unknown pairs) -> 0.
    Distances use `scale` when given (each row's self-tuning scale, taken from a larger graph
    than this one), else the 7th-neighbour distance within `values`."""
    values = np.asarray(values, dtype=np.float64)
    known = ~np.isnan(values)
    np.fill_diagonal(known, False)
    if is_similarity:
        weights = np.where(known, np.clip(values, 0.0, None), 0.0)
    else:
        dist = np.where(known, values, np.inf)
        k = min(SELF_TUNING_NEIGHBOUR, max(len(values) - 1, 1))
        if scale is None:
            scale = np.sort(dist, axis=1)[:, k - 1]
            scale = np.where(np.isfinite(scale), scale, np.nanmax(
                np.where(known, values, np.nan), axis=1, initial=0.0))
        scale = np.clip(np.asarray(scale, dtype=np.float64), 1e-12, None)
        weights = np.where(known, np.exp(-np.where(known, values, 0.0) ** 2
                                          / np.outer(scale, scale)), 0.0)
    weights = (weights + weights.T) / 2
    np.fill_diagonal(weights, 0.0)
    return weights


def knn_affinity(neighbours: np.ndarray, values: np.ndarray, is_similarity: bool) -> Any:
    """The sparse counterpart of `affinity` on a k-nearest-neighbour graph: row i of
    `neighbours` (n, k) lists i's closest others (-1: none), `values` their similarities (best
    first) or distances (closest first). An edge is kept when either end lists it; distances
    take the self-tuning scale from the lists (s_i = the distance to i's 7th neighbour)."""
    from scipy import sparse

    n = len(neighbours)
    rows = np.repeat(np.arange(n), neighbours.shape[1])
    cols, vals = neighbours.ravel(), values.ravel().astype(np.float64)
    keep = (cols >= 0) & (cols != rows) & np.isfinite(vals)
    rows, cols, vals = rows[keep], cols[keep], vals[keep]
    if is_similarity:
        weights = np.clip(vals, 0.0, None)
    else:
        scale = knn_scale(values)
        weights = np.exp(-vals ** 2 / (scale[rows] * scale[cols]))
    graph = sparse.csr_array((weights, (rows, cols)), shape=(n, n))
    graph = graph.maximum(graph.T)  # the same pair listed by both ends counts once
    graph.eliminate_zeros()
    return graph


def knn_scale(values: np.ndarray) -> np.ndarray:
    """Each row's self-tuning scale from its neighbour distances (closest first): the 7th,
    or the farthest it has."""
    values = np.asarray(values, dtype=np.float64)
    k = min(SELF_TUNING_NEIGHBOUR, values.shape[1]) - 1
    finite = np.where(np.isfinite(values), values, np.nan)
    farthest = np.nanmax(np.where(np.isnan(finite), -np.inf, finite), axis=1, initial=0.0)
    scale = np.where(np.isfinite(values[:, k]), values[:, k], farthest)
    return np.clip(scale, 1e-12, None)


def _edges(weights: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cols, weights) of the positive edges i < j of a dense or sparse graph."""
    from scipy import sparse

    if sparse.issparse(weights):
        upper = sparse.triu(weights, 1).tocoo()
        keep = upper.data > 0
        return upper.row[keep], upper.col[keep], upper.data[keep]
    rows, cols = np.nonzero(np.triu(weights, 1) > 0)
    return rows, cols, weights[rows, cols]


Backend = Callable[[int, tuple[np.ndarray, np.ndarray, np.ndarray], float, int],
                   list[set[int]]]
BACKENDS: Registry[Backend] = Registry("community backend")


@BACKENDS.register("networkx", "NetworkX louvain_communities (pure Python)")
def _networkx(n: int, edges: tuple[np.ndarray, np.ndarray, np.ndarray], resolution: float,
              seed: int) -> list[set[int]]:
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    graph.add_weighted_edges_from(zip(*(e.tolist() for e in edges), strict=True))
    return [set(c) for c in nx.community.louvain_communities(
        graph, weight="weight", resolution=resolution, seed=seed)]


@BACKENDS.register("igraph", "igraph community_multilevel (C)")
def _igraph(n: int, edges: tuple[np.ndarray, np.ndarray, np.ndarray], resolution: float,
            seed: int) -> list[set[int]]:
    import igraph as ig

    rows, cols, weights = edges
    graph = ig.Graph(n=n, edges=np.column_stack([rows, cols]))
    ig.set_random_number_generator(random.Random(seed))
    try:
        found = graph.community_multilevel(weights=weights, resolution=resolution)
    finally:
        ig.set_random_number_generator(random)
    return [set(c) for c in found]


def _block_sums(weights: Any, parts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Total weight within (diagonal) and between communities, and their sizes."""
    onehot = np.zeros((weights.shape[0], len(parts)))
    for k, part in enumerate(parts):
        onehot[part, k] = 1.0
    return onehot.T @ np.asarray(weights @ onehot), onehot.sum(0)


def block_means(weights: Any, parts: list[list[int]]) -> np.ndarray:
    """Mean weight of the pairs within (diagonal; NaN for a singleton) and between
    communities."""
    sums, sizes = _block_sums(weights, parts)
    pairs = np.outer(sizes, sizes) - np.diag(sizes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pairs > 0, sums / np.maximum(pairs, 1), np.nan)


def modularity(weights: Any, parts: list[list[int]], resolution: float = 1.0) -> float:
    """Newman's weighted modularity of a partition (0 for a graph without edges)."""
    sums, _ = _block_sums(weights, parts)
    total = sums.sum()
    if total <= 0:
        return 0.0
    strength = sums.sum(1)
    return float(np.sum(np.diag(sums) / total - resolution * (strength / total) ** 2))


def cross_ratio(means: np.ndarray, parts: list[list[int]]) -> float:
    """Mean weight of the pairs in different communities over that of pairs in the same one,
    from `block_means`: near 0 when communities are really apart, near 1 when Louvain only cut
    a uniform cloud (Louvain always returns some partition; modularity alone cannot tell, being
    bounded by the parts' balance: a 90/10 split scores at most 0.18)."""
    sizes = np.array([len(p) for p in parts], dtype=np.float64)
    if len(parts) < 2:
        return 1.0
    pairs = np.outer(sizes, sizes) - np.diag(sizes)
    known = np.nan_to_num(means) * pairs
    within_pairs = np.diag(pairs).sum()
    if within_pairs <= 0:
        return 0.0
    inside = np.trace(known) / within_pairs
    between = (known.sum() - np.trace(known)) / (pairs.sum() - within_pairs)
    return float(between / inside) if inside > 0 else 1.0


def merge_close(graph: Any, parts: list[list[int]], max_ratio: float) -> list[list[int]]:
    """Merge communities that are not really apart, closest pair first: two communities stay
    apart only while the mean weight between them is at most `max_ratio` times the mean weight
    within them (a singleton borrows the other's; two singletons the average community's).
    Louvain cuts a uniform cloud into pieces; this puts such pieces back together, while
    communities with (almost) no edge between them, e.g. isolated clients, stay apart.
    `graph` is the weights (dense or sparse) or a function giving the `block_means` of a
    partition (on a k-nearest-neighbour graph: estimated from sampled pairs)."""
    means = graph if callable(graph) else (lambda parts: block_means(graph, parts))
    parts = [list(p) for p in parts]
    while len(parts) > 1:
        between = means(parts)
        within = np.diag(between)
        typical = float(np.nanmean(within)) if np.isfinite(within).any() else 0.0
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


def louvain(weights: Any, resolution: float = 1.0, seed: int = 0,
            backend: str = "igraph") -> Communities:
    """Louvain communities of a weighted graph (dense or sparse), largest first."""
    n = weights.shape[0]
    if n == 0:
        return Communities([], 0.0, 1.0)
    edges = _edges(weights)
    if not len(edges[0]):  # no edges: no evidence of any grouping
        return Communities([list(range(n))], 0.0, 1.0)
    found = BACKENDS.get(backend)(n, edges, resolution, seed)
    parts = sorted((sorted(c) for c in found), key=lambda p: (-len(p), p[0]))
    return Communities(parts, modularity(weights, parts, resolution),
                       cross_ratio(block_means(weights, parts), parts))


def _subgraph(weights: Any, rows: list[int]) -> Any:
    """The graph among `rows` (dense or sparse)."""
    from scipy import sparse

    if sparse.issparse(weights):
        return sparse.csr_array(weights)[rows][:, rows]
    return weights[np.ix_(rows, rows)]


def separated_share(cuts: list[list[list[int]]], a: list[int], b: list[int]) -> float | None:
    """The share of pairs (one member of `a`, one of `b`, both in one cut) that the cut sets
    in different parts, over all `cuts` (each a list of parts of client ids); None when no cut
    holds a member of each. Counted per part: all pairs less those within one part.

    A member alone in its part is not counted: a part of one is one update unlike the rest,
    not a group shown to exist. Single linkage leaves
    a window's outliers alone in every cut, and a window holding identical updates is cut
    into their block with every other update alone (`split_stats._best_cut`: the fewest parts
    without scatter). Counted, such cuts set every pair of a group apart: under a colluding
    sign-flip attack (60%, `min_coverage: 0.25`, seeds 1-2) they split the benign community
    into 4-5 clusters, the largest with the late attackers in it."""
    separated = pairs = 0
    for cut in cuts:
        part_of = {c: k for k, part in enumerate(cut) if len(part) > 1 for c in part}
        left = Counter(part_of[c] for c in a if c in part_of)
        right = Counter(part_of[c] for c in b if c in part_of)
        both = left.total() * right.total()
        pairs += both
        separated += both - sum(n * right[k] for k, n in left.items())
    return separated / pairs if pairs else None


def _join_together(parts: list[list[int]], apart: Callable[[list[int], list[int]], bool]
                   ) -> list[list[int]]:
    """`parts` with every two not `apart` joined, transitively (the connected components of
    the graph of the pairs not apart)."""
    from scipy.sparse.csgraph import connected_components

    together = np.zeros((len(parts), len(parts)), dtype=bool)
    for i, j in zip(*np.triu_indices(len(parts), 1), strict=True):
        together[i, j] = not apart(parts[i], parts[j])
    _, label = connected_components(together, directed=False)
    joined: dict[int, list[int]] = {}
    for k, part in zip(label.tolist(), parts, strict=True):
        joined.setdefault(k, []).extend(part)
    return [sorted(p) for p in joined.values()]


@dataclass
class NestedCommunities:
    first: Communities  # Louvain's partition of the whole graph
    merged: list[list[int]]  # `first` after `merge_close`: one level, as the paper has it
    parts: list[list[int]]  # after each community was partitioned again, largest first


def nested_communities(weights: Any, means: Callable[[list[list[int]]], np.ndarray],
                       max_ratio: float, resolution: float = 1.0, seed: int = 0,
                       backend: str = "igraph",
                       apart: Callable[[list[int], list[int]], bool | None] | None = None
                       ) -> NestedCommunities:
    """Louvain communities kept apart by `merge_close` (with `means`, the `block_means` of a
    partition of the whole graph), each partitioned again on its own subgraph until none holds
    parts kept apart (see the module doc: modularity's resolution limit). Two parts of a
    community stay apart when `apart(a, b)` says so, or, where it has no evidence (None) or is
    not given, when `merge_close`'s ratio test keeps them apart; parts not kept apart are
    joined."""
    first = louvain(weights, resolution, seed, backend)
    merged = merge_close(means, first.parts, max_ratio)
    todo = list(merged)
    final: list[list[int]] = []

    def kept_apart(a: list[int], b: list[int]) -> bool:
        verdict = None if apart is None else apart(a, b)
        if verdict is not None:
            return verdict
        return len(merge_close(means, [a, b], max_ratio)) == 2

    while todo:
        part = todo.pop()
        inner = louvain(_subgraph(weights, part), resolution, seed, backend).parts \
            if len(part) > 2 else []  # two clients: Louvain would always part them
        pieces = _join_together([[part[i] for i in p] for p in inner], kept_apart) \
            if len(inner) > 1 else []
        if len(pieces) > 1:
            todo.extend(pieces)
        else:
            final.append(sorted(part))
    return NestedCommunities(first, merged, sorted(final, key=lambda p: (-len(p), p[0])))
