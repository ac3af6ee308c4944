"""The statistics CFL looks at before splitting a cluster (all from the cosine matrix + norms).

- `alpha_intra_min`, `alpha_cross_max`, `gap`: the separation of the proposed bipartition
  (the paper: a correct split has alpha_cross_max < alpha_intra_min).
- `gamma_max` and `gamma_bound = sqrt((1 - alpha_cross_max) / 2)`: the paper's guarantee that
  the split separates incongruent clients holds when gamma_max < gamma_bound.
- `pseudo_f`: the Calinski-Harabasz ratio of the bipartition computed on unit-normalised updates
  from the cosine matrix alone. It is scale-free: about 1 for structureless updates whatever
  their norms, large when the two parts point in different directions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from fedflock.clustering.bipartition import Linkage, bipartition


@dataclass
class SplitStats:
    parts: tuple[list[int], list[int]]  # positions into the rows given
    alpha_intra_min: float
    alpha_cross_max: float
    gap: float
    gamma_max: float
    gamma_bound: float
    pseudo_f: float
    mean_norm: float
    max_norm: float

    def figures(self) -> dict[str, float]:
        out = asdict(self)
        out.pop("parts")
        return {k: round(float(v), 6) for k, v in out.items()}


def pseudo_f(similarity: np.ndarray, parts: tuple[list[int], list[int]]) -> float:
    n = len(similarity)
    if n <= 2:
        return 0.0
    total = n - similarity.sum() / n
    within = sum(len(p) - similarity[np.ix_(p, p)].sum() / len(p) for p in parts)
    between = total - within
    if within <= 1e-12:
        return math.inf
    return float(between / (within / (n - 2)))


def split_stats(gram: np.ndarray, weights: np.ndarray, similarity: np.ndarray,
                linkage: Linkage = "single") -> SplitStats:
    """Statistics of the best bipartition of one cluster, from the Gram matrix of its updates
    (rows in the same order as `similarity`) and the clients' example counts."""
    gram = np.asarray(gram, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    parts = bipartition(similarity, linkage)
    a, b = parts
    intra = np.concatenate(
        [similarity[np.ix_(p, p)][~np.eye(len(p), dtype=bool)] for p in parts]
    )
    sq_norms = np.clip(np.diag(gram), 0.0, None)
    gamma = np.zeros(len(gram))
    for p in parts:
        # ||u_i - m||^2 with m the weighted mean of part p, expanded through the Gram matrix.
        wp = w[p] / w[p].sum()
        cross = gram[np.ix_(p, p)] @ wp
        mean_sq = wp @ gram[np.ix_(p, p)] @ wp
        dist = np.clip(sq_norms[p] - 2 * cross + mean_sq, 0.0, None)
        gamma[p] = np.sqrt(dist) / np.maximum(np.sqrt(sq_norms[p]), 1e-300)
    alpha_cross_max = float(similarity[np.ix_(a, b)].max())
    alpha_intra_min = float(intra.min()) if intra.size else 1.0
    wn = w / w.sum()
    return SplitStats(
        parts=parts,
        alpha_intra_min=alpha_intra_min,
        alpha_cross_max=alpha_cross_max,
        gap=alpha_intra_min - alpha_cross_max,
        gamma_max=float(gamma.max()),
        gamma_bound=math.sqrt(max(0.0, (1.0 - alpha_cross_max) / 2.0)),
        pseudo_f=pseudo_f(similarity, parts),
        mean_norm=float(np.sqrt(max(wn @ gram @ wn, 0.0))),
        max_norm=float(np.sqrt(sq_norms.max())),
    )
