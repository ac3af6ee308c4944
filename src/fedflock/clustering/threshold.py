"""Clustering without a preset number of clusters: the connected components of the graph that
joins two clients when their distance is below a threshold (DistFL's union-find merge; the same
partition as single linkage cut at that height).

The threshold is either given (DistFL's paper: 0.2 on the KL divergence of responses) or set
from the data: `relative_threshold` takes `factor` times the median nearest-neighbour distance,
i.e. a multiple of how far apart clients of one cluster typically are. It is scale-free (the
same factor whatever the divergence's units), and on structureless clients, whose nearest
neighbours are about as far as everyone else, single linkage at a few times that spread chains
them all into one cluster: no split.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components


def threshold_components(distance: np.ndarray, threshold: float) -> list[list[int]]:
    """Connected components of {(i, j): distance[i, j] < threshold}, each sorted, ordered by
    their smallest member. `distance` may be non-symmetric: a pair is joined when either
    direction is below the threshold (the authors' rule)."""
    close = np.asarray(distance) < threshold
    np.fill_diagonal(close, True)
    count, labels = connected_components(csr_matrix(close), directed=True, connection="weak")
    parts = [np.flatnonzero(labels == k).tolist() for k in range(count)]
    return sorted(parts, key=lambda part: part[0])


def relative_threshold(distance: np.ndarray, factor: float = 3.0) -> float:
    """`factor` times the median over clients of the distance to their nearest neighbour."""
    d = np.asarray(distance, dtype=float)
    d = np.minimum(d, d.T)  # the closer direction, as the merge rule joins on either
    off = d + np.diag(np.full(len(d), np.inf))
    return float(factor * np.median(off.min(axis=1)))
