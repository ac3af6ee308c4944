"""Agglomerative clustering of clients on a distance matrix into a given number of clusters
(PACFL with `clusters: K`; the hierarchical methods to come share it). SciPy's linkage on the
condensed matrix; the parts are ordered by their smallest member, as the other partitions."""

from __future__ import annotations

from typing import Literal

import numpy as np

Linkage = Literal["average", "complete", "single"]


def linkage_parts(distance: np.ndarray, clusters: int, method: Linkage = "average"
                  ) -> list[list[int]]:
    """The `clusters` parts of the dendrogram of `distance` (symmetrised), each sorted."""
    from scipy.cluster.hierarchy import fcluster, linkage  # server-only imports
    from scipy.spatial.distance import squareform

    d = np.asarray(distance, dtype=float)
    n = len(d)
    if clusters >= n:
        return [[i] for i in range(n)]
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0.0)
    labels = fcluster(linkage(squareform(d, checks=False), method=method), clusters,
                      criterion="maxclust")
    parts = [np.flatnonzero(labels == k).tolist() for k in np.unique(labels)]
    return sorted(parts, key=lambda part: part[0])
