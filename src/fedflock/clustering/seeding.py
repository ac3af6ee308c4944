"""Farthest-point (maximin) seeding: K spread-out points of a similarity matrix.

The deterministic form of k-means++ seeding (Gonzalez 1985): start from the point least similar
to the mean, then repeatedly add the point whose highest similarity to the seeds so far is
lowest. Used to start K cluster models from K clients that disagree most (IFCA's `init: clients`).
"""

from __future__ import annotations

import numpy as np


def farthest_point_seeds(similarity: np.ndarray, k: int) -> list[int]:
    """Indices of `k` seeds (all points when there are fewer), most mutually dissimilar first."""
    n = len(similarity)
    if k >= n:
        return list(range(n))
    seeds = [int(np.argmin(similarity.mean(1)))]
    closest = similarity[seeds[0]].copy()  # each point's highest similarity to a seed
    for _ in range(k - 1):
        closest[seeds] = np.inf
        seeds.append(int(np.argmin(closest)))
        closest = np.maximum(closest, similarity[seeds[-1]])
    return seeds


def nearest_seed(similarity: np.ndarray, seeds: list[int]) -> np.ndarray:
    """For every point, the position (0..k-1) of its most similar seed."""
    return np.argmax(similarity[:, seeds], axis=1)
