"""Bipartition of a similarity matrix.

The CFL paper's Algorithm 1 merges clusters in order of decreasing pairwise similarity until two
remain: the min-max cut (the two parts whose most similar cross pair is least similar). That is
exactly single linkage, i.e. cutting the weakest edge of the maximum spanning tree, which SciPy
computes in O(M^2). `minmax_bipartition_reference` is a direct port of Algorithm 1, kept to test
against. The authors' public notebook uses complete linkage instead, a different cut; it is
offered as `linkage="complete"`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Linkage = Literal["single", "complete"]


def merge_tree(similarity: np.ndarray, linkage: Linkage = "single") -> np.ndarray:
    """SciPy's linkage matrix of the items, at distance 1 - similarity (symmetrised)."""
    sim = np.asarray(similarity, dtype=np.float64)
    if len(sim) < 2:
        raise ValueError("a bipartition needs at least two items")
    # SciPy is imported here, not at module level: a ClientApp process imports the algorithms
    # (for config validation) and must not pay for what only a server runs.
    from scipy.cluster.hierarchy import linkage as scipy_linkage
    from scipy.spatial.distance import squareform

    distance = 1.0 - (sim + sim.T) / 2.0
    np.fill_diagonal(distance, 0.0)
    return scipy_linkage(squareform(np.clip(distance, 0.0, None), checks=False), linkage)


def bipartition(similarity: np.ndarray, linkage: Linkage = "single") -> tuple[list[int], list[int]]:
    """Split indices 0..M-1 into two non-empty parts; the part holding index 0 comes first."""
    from scipy.cluster.hierarchy import to_tree

    tree = to_tree(merge_tree(similarity, linkage))
    left = sorted(tree.get_left().pre_order())
    right = sorted(tree.get_right().pre_order())
    return (left, right) if 0 in left else (right, left)


def minmax_bipartition_reference(similarity: np.ndarray) -> tuple[list[int], list[int]]:
    """Direct port of the CFL paper's Algorithm 1 (O(M^3)); for tests only."""
    sim = np.asarray(similarity, dtype=np.float64)
    m = len(sim)
    clusters = [{i} for i in range(m)]
    for flat in np.argsort(-sim, axis=None, kind="stable"):
        i1, i2 = divmod(int(flat), m)
        merged = set()
        for c in [c for c in clusters if i1 in c or i2 in c]:
            merged |= c
            clusters.remove(c)
        clusters.append(merged)
        if len(clusters) == 2:
            a, b = sorted(clusters[0]), sorted(clusters[1])
            return (a, b) if 0 in a else (b, a)
    raise ValueError("a bipartition needs at least two items")
