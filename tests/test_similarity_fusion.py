"""FedDAG's similarity pieces: the log-count weighted subspace distance, cosine of sparsified
updates, and the entropy-minimising fusion of two similarity matrices."""

from __future__ import annotations

import math

import torch

from fedflock.similarity.cosine import cosine_matrix
from fedflock.similarity.fusion import fuse_by_entropy, row_entropy
from fedflock.similarity.sparse import random_mask, sparse_cosine, top_k
from fedflock.similarity.subspaces import class_angles, weighted_subspace_distance


def _basis(*columns: list[float]) -> torch.Tensor:
    """(d, p) with the given unit columns."""
    return torch.tensor(columns, dtype=torch.float64).T


def test_a_class_one_client_lacks_counts_as_90_degrees_weighted_by_log_counts() -> None:
    x, tilted = _basis([1.0, 0.0, 0.0]), _basis([math.cos(0.3), math.sin(0.3), 0.0])
    bases_a = torch.stack([x, x])[None]  # client a: classes 0 and 1
    bases_b = torch.stack([tilted, torch.zeros(3, 1, dtype=torch.float64)])[None]  # only 0
    counts_a, counts_b = torch.tensor([[20.0, 5.0]]), torch.tensor([[7.0, 0.0]])
    theta = float(class_angles(x[None], tilted[None])[0, 0])
    assert abs(theta - math.degrees(0.3)) < 1e-9
    w0, w1 = math.log(21) + math.log(8), math.log(6)
    want = (w0 * theta + w1 * 90.0) / (w0 + w1)
    got = weighted_subspace_distance(bases_a, counts_a, bases_b, counts_b)
    assert abs(float(got[0, 0]) - want) < 1e-9
    same = weighted_subspace_distance(bases_a, counts_a, bases_a, counts_a)
    assert float(same[0, 0]) < 1e-6


def test_a_shared_random_mask_and_each_updates_top_k() -> None:
    gen = torch.Generator().manual_seed(0)
    updates = torch.randn(5, 200, generator=gen, dtype=torch.float64)
    mask = random_mask(200, 0.05, seed=3)
    assert len(mask) == 10 and torch.equal(mask, random_mask(200, 0.05, seed=3))
    assert not torch.equal(mask, random_mask(200, 0.05, seed=4))
    assert torch.allclose(sparse_cosine(updates, 0.05, "random", seed=3),
                          cosine_matrix(updates[:, mask]))
    kept = top_k(updates, 0.05)
    assert bool(((kept != 0).sum(1) == 10).all())
    smallest_kept = kept.abs().masked_fill(kept == 0, float("inf")).min(1).values
    largest_dropped = updates.abs().masked_fill(kept != 0, 0.0).max(1).values
    assert bool((smallest_kept >= largest_dropped).all())


def test_each_client_leans_on_the_similarity_that_separates_its_neighbours() -> None:
    n = 4
    flat = torch.full((n, n), 0.5, dtype=torch.float64).fill_diagonal_(1.0)
    peaked = flat.clone()
    peaked[0, 1] = peaked[1, 0] = 1.0  # clients 0 and 1 stand out in the gradients only
    peaked[0, 2:] = peaked[1, 2:] = 0.0
    peaked[2:, 0] = peaked[2:, 1] = 0.0
    fused, weights = fuse_by_entropy(peaked, flat, temperature=0.1)
    assert float(weights[0]) == 1.0 and float(weights[1]) == 1.0
    swapped, weights_swapped = fuse_by_entropy(flat, peaked, temperature=0.1)
    assert float(weights_swapped[0]) == 0.0  # now the data similarity is the peaked one
    assert torch.allclose(fused, fused.T) and torch.allclose(swapped, swapped.T)
    uniform = row_entropy(flat[None], 0.1)[0]
    assert torch.allclose(uniform, torch.full((n,), math.log(n - 1), dtype=torch.float64))


def test_the_sweep_finds_tight_groups_and_keeps_a_structureless_cloud_whole() -> None:
    import numpy as np

    from fedflock.clustering.hierarchical import sweep_partition

    rng = np.random.default_rng(0)
    centres = np.repeat(np.eye(3) * 10, 8, axis=0)  # 3 groups of 8 in 3-D
    points = centres + rng.normal(size=centres.shape)
    distance = np.linalg.norm(points[:, None] - points[None], axis=2)
    parts, figures = sweep_partition(distance)
    assert sorted(map(len, parts)) == [8, 8, 8]
    assert all(len({i // 8 for i in part}) == 1 for part in parts)
    assert figures["small_share"] == 0 and 0 < figures["compactness"] < 0.5
    cloud = rng.normal(size=(24, 20))
    whole, figures = sweep_partition(np.linalg.norm(cloud[:, None] - cloud[None], axis=2))
    assert whole == [list(range(24))] and figures["score"] == 1.0
    # groups below min_size cost their share: forbidding them merges the groups
    merged, _ = sweep_partition(distance, min_size=9)
    assert len(merged) < 3
