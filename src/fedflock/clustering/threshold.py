"""Clustering without a preset number of clusters: the connected components of a graph on the
clients, joined either below a distance threshold or to their nearest neighbours.

- `threshold_components`: two clients are joined when their distance is below a threshold
  (DistFL's union-find merge; the same partition as single linkage cut at that height). Its
  threshold is in the distance's units (DistFL's paper: 0.2 on the KL of responses).
- `neighbour_components`: every client is joined to its k nearest others (the union k-NN
  graph). It uses ranks only, so it is scale-free and indifferent to heavy tails (one client
  whose local training drifted far does not move anyone else's neighbours). A structureless
  cloud of n points gives a connected k-NN graph with high probability once k grows like log n
  (Brito, Chavez, Quiroz & Yukich 1997), so `default_neighbours(n)` = round(ln n), at least 2:
  the IID control stays whole; groups stay apart as long as each has more than k members whose
  k nearest clients are all inside it.
"""

from __future__ import annotations

import math

import numpy as np


def threshold_components(distance: np.ndarray, threshold: float) -> list[list[int]]:
    """Connected components of {(i, j): distance[i, j] < threshold}, each sorted, ordered by
    their smallest member. `distance` may be non-symmetric: a pair is joined when either
    direction is below the threshold (the authors' rule)."""
    from scipy.sparse import csr_matrix  # server-only: kept out of the ClientApp's import
    from scipy.sparse.csgraph import connected_components

    close = np.asarray(distance) < threshold
    np.fill_diagonal(close, True)
    count, labels = connected_components(csr_matrix(close), directed=True, connection="weak")
    parts = [np.flatnonzero(labels == k).tolist() for k in range(count)]
    return sorted(parts, key=lambda part: part[0])


def default_neighbours(n: int) -> int:
    """k for `neighbour_components` on n clients: round(ln n), at least 2 (8 clients: 2,
    20: 3, 50: 4, 100: 5, 1,000: 7)."""
    return max(2, round(math.log(max(n, 1))))


def neighbour_components(distance: np.ndarray, k: int) -> list[list[int]]:
    """Connected components of the union k-nearest-neighbour graph, ordered as
    `threshold_components`. A non-symmetric distance ranks by the closer direction (the merge
    rule's either-direction reading); ties go to the lower index."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    d = np.asarray(distance, dtype=float)
    d = np.minimum(d, d.T)
    n = len(d)
    k = min(k, n - 1)
    if k <= 0:
        return [[i] for i in range(n)]
    ranked = np.argsort(d + np.diag(np.full(n, np.inf)), axis=1, kind="stable")[:, :k]
    rows = np.repeat(np.arange(n), k)
    graph = csr_matrix((np.ones(n * k), (rows, ranked.ravel())), shape=(n, n))
    count, labels = connected_components(graph, directed=True, connection="weak")
    parts = [np.flatnonzero(labels == c).tolist() for c in range(count)]
    return sorted(parts, key=lambda part: part[0])


def neighbour_partition(distance: np.ndarray, k: int | None = None
                        ) -> tuple[list[list[int]], dict[str, float | int]]:
    """`neighbour_components` with k = `default_neighbours(n)` unless given, and the figures of
    the rule: k and `scale`, the median distance of a client to its k-th nearest (what a
    similarity matrix exp(-distance / scale) is drawn against)."""
    d = np.asarray(distance, dtype=float)
    n = len(d)
    k = min(k or default_neighbours(n), n - 1)
    closer = np.minimum(d, d.T) + np.diag(np.full(n, np.inf))
    scale = float(np.median(np.sort(closer, axis=1)[:, k - 1])) if k > 0 else 0.0
    return neighbour_components(d, k), {"neighbours": k, "scale": round(max(scale, 1e-12), 6)}


def separation(distance: np.ndarray, parts: list[list[int]]) -> dict[str, float | None]:
    """How far apart a partition's parts lie: the largest distance inside a part and the
    smallest between two (None where there is no such pair); positions index `distance`."""
    d = np.asarray(distance, dtype=float)
    d = np.minimum(d, d.T)
    label = np.empty(len(d), dtype=int)
    for k, part in enumerate(parts):
        label[part] = k
    same = label[:, None] == label[None, :]
    np.fill_diagonal(same, False)
    between = label[:, None] != label[None, :]
    return {"max_within": round(float(d[same].max()), 6) if same.any() else None,
            "min_between": round(float(d[between].min()), 6) if between.any() else None}
