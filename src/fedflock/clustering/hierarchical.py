"""Agglomerative clustering of clients on a distance matrix: into a given number of clusters
(PACFL, FedDAG and FL+HC with `clusters: K`), at a distance threshold (FL+HC's paper), or the
dendrogram's cut of lowest compactness plus small-cluster penalty (FedDAG's threshold sweep,
FL+HC's default). SciPy's linkage on the condensed matrix;
the parts are ordered by their smallest member, as the other partitions."""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

# ward treats the distances as Euclidean (Lance-Williams update): give it Euclidean ones
Linkage = Literal["average", "complete", "single", "ward"]


def _symmetric(distance: np.ndarray) -> np.ndarray:
    d = np.asarray(distance, dtype=float)
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0.0)
    return d


def _cut(distance: np.ndarray, method: Linkage, value: float, criterion: str
         ) -> list[list[int]]:
    from scipy.cluster.hierarchy import fcluster, linkage  # server-only imports
    from scipy.spatial.distance import squareform

    tree = linkage(squareform(_symmetric(distance), checks=False), method=method)
    labels = fcluster(tree, value, criterion=criterion)
    parts = [np.flatnonzero(labels == k).tolist() for k in np.unique(labels)]
    return sorted(parts, key=lambda part: part[0])


def linkage_parts(distance: np.ndarray, clusters: int, method: Linkage = "average"
                  ) -> list[list[int]]:
    """The `clusters` parts of the dendrogram of `distance` (symmetrised), each sorted."""
    n = len(distance)
    if clusters >= n:
        return [[i] for i in range(n)]
    return _cut(distance, method, clusters, "maxclust")


def distance_parts(distance: np.ndarray, threshold: float, method: Linkage = "average"
                   ) -> list[list[int]]:
    """The parts of the dendrogram of `distance` whose merges all lie below `threshold`."""
    if len(distance) < 2:
        return [list(range(len(distance)))]
    return _cut(distance, method, threshold, "distance")


def sweep_partition(distance: np.ndarray, penalty: float = 2.0, min_size: int | None = None,
                    method: Linkage = "average") -> tuple[list[list[int]], dict[str, Any]]:
    """The cut of the dendrogram of `distance` of lowest L = L1 + penalty * L2 (FedDAG's
    threshold sweep). Every merge height is a threshold, so the sweep is every partition the
    dendrogram holds, with no unit or step to choose. L1, compactness: the mean distance
    within clusters over the mean distance between all clients (0 when no cluster has two
    members); L2: the share of clients in clusters smaller than `min_size` (default: sqrt(n),
    the size of each of sqrt(n) equal clusters). Singletons score `penalty` and one cluster
    1, so a penalty above 1 keeps a federation without structure whole; ties go to fewer
    clusters. Figures: the threshold, the score and its two terms, `min_size` and
    `penalty`."""
    from scipy.cluster.hierarchy import linkage  # server-only imports
    from scipy.spatial.distance import squareform

    d = _symmetric(distance)
    n = len(d)
    smallest = min_size if min_size is not None else math.sqrt(n)
    overall = d.sum() / max(n * (n - 1), 1)
    members: dict[int, list[int]] = {i: [i] for i in range(n)}
    within = pairs = 0.0  # sum of distances and count of (unordered) pairs inside clusters

    def score() -> tuple[float, float, float]:
        compact = float(within / pairs / overall) if pairs and overall > 0 else 0.0
        small = sum(len(m) for m in members.values() if len(m) < smallest) / n
        return compact + penalty * small, compact, small

    best = (*score(), 0.0, {k: list(v) for k, v in members.items()})
    if n > 1:
        for step, (a, b, height, _) in enumerate(linkage(squareform(d, checks=False),
                                                          method=method)):
            left, right = members.pop(int(a)), members.pop(int(b))
            within += float(d[np.ix_(left, right)].sum())
            pairs += len(left) * len(right)
            members[n + step] = left + right
            total, compact, small = score()
            if total <= best[0] + 1e-12:  # ties: the later cut, fewer clusters
                best = (total, compact, small, float(height),
                        {k: list(v) for k, v in members.items()})
    total, compact, small, threshold, parts = best
    figures = {"threshold": round(threshold, 6), "score": round(total, 6),
               "compactness": round(compact, 6), "small_share": round(small, 6),
               "min_size": round(float(smallest), 3), "penalty": penalty}
    return sorted((sorted(p) for p in parts.values()), key=lambda p: p[0]), figures
