"""Bipartition (min-max cut), split statistics, cosine similarity, the parameter tree."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedflock.clustering import ParameterTree, bipartition, minmax_bipartition_reference
from fedflock.clustering.split_stats import (
    kway_pseudo_f,
    max_parts,
    pseudo_f,
    split_stats,
)
from fedflock.similarity import cosine_matrix, gram_matrix
from tests.conftest import groups_and_outliers


def _random_similarity(m: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, size=(m, m))
    s = (a + a.T) / 2
    np.fill_diagonal(s, 1.0)
    return s


@settings(max_examples=300, deadline=None)
@given(m=st.integers(2, 40), seed=st.integers(0, 2**32 - 1))
def test_minmax_cut_equals_the_papers_algorithm_1(m: int, seed: int) -> None:
    sim = _random_similarity(m, seed)
    fast = bipartition(sim, "single")
    assert fast == minmax_bipartition_reference(sim)
    a, b = fast
    assert a and b and sorted(a + b) == list(range(m))
    # The defining property: no other split has a lower maximum cross similarity.
    cross = sim[np.ix_(a, b)].max()
    rng = np.random.default_rng(seed)
    for _ in range(20):
        mask = rng.random(m) < 0.5
        if mask.all() or not mask.any():
            continue
        assert sim[np.ix_(np.flatnonzero(mask), np.flatnonzero(~mask))].max() >= cross - 1e-12


def test_complete_linkage_is_a_different_cut() -> None:
    differ = sum(
        bipartition(_random_similarity(12, s), "complete") != bipartition(_random_similarity(12, s))
        for s in range(50)
    )
    assert differ > 0


@settings(max_examples=100, deadline=None)
@given(m=st.integers(2, 30), d=st.integers(1, 50), seed=st.integers(0, 2**31))
def test_cosine_matrix_matches_pairwise_definition(m: int, d: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=g, dtype=torch.float64)
    sim = cosine_matrix(x)
    i, j = 0, m - 1
    expected = float(x[i] @ x[j] / (x[i].norm() * x[j].norm()))
    assert math.isclose(float(sim[i, j]), expected, abs_tol=1e-12)
    assert torch.allclose(sim, sim.T)
    assert torch.allclose(sim.diagonal(), torch.ones(m, dtype=torch.float64))


def test_zero_update_has_no_direction() -> None:
    x = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    sim = cosine_matrix(x)
    assert sim[1, 1] == 0 and sim[0, 1] == 0


def _two_directions(n: int, d: int, noise: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(2, d, generator=g, dtype=torch.float64)
    rows = [base[i % 2] + noise * torch.randn(d, generator=g, dtype=torch.float64)
            for i in range(n)]
    return torch.stack(rows)


def test_pseudo_f_is_near_one_without_structure_and_large_with_it() -> None:
    g = torch.Generator().manual_seed(0)
    noise_only = torch.randn(20, 5000, generator=g, dtype=torch.float64)
    sim = cosine_matrix(noise_only).numpy()
    f_noise = pseudo_f(sim, bipartition(sim))
    assert 0.5 < f_noise < 2.0
    # Scale-free: multiplying updates by any factor leaves F unchanged.
    scaled = cosine_matrix(noise_only * 1e3).numpy()
    assert math.isclose(pseudo_f(scaled, bipartition(scaled)), f_noise, rel_tol=1e-9)
    structured = _two_directions(20, 5000, noise=1.0, seed=1)
    sim2 = cosine_matrix(structured).numpy()
    assert pseudo_f(sim2, bipartition(sim2)) > 10


def _cut_pseudo_f(sim: np.ndarray, parts: list[np.ndarray]) -> float:
    n, k, diag = len(sim), len(parts), np.diag(sim)
    total = diag.sum() - sim.sum() / n
    within = sum(diag[p].sum() - sim[np.ix_(p, p)].sum() / len(p) for p in parts)
    return ((total - within) / (k - 1)) / (within / (n - k))


def test_kway_pseudo_f_scores_a_zero_update_as_it_is_and_identical_ones_as_no_groups() -> None:
    """A zero update has a 0 on the cosine diagonal: it adds no scatter of its own (the score
    is the cut's, scored directly); updates all alike hold no groups (0, not 0/0 = inf)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(12, 30))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[5] = 0.0
    sim = x @ x.T
    best, k = kway_pseudo_f(sim)
    from fedflock.clustering.bipartition import merge_tree
    from fedflock.clustering.split_stats import cut_parts

    parts = [np.array(p) for p in cut_parts(merge_tree(sim), k)]
    assert best == pytest.approx(_cut_pseudo_f(sim, parts), rel=1e-9)
    same = np.ones((6, 6))
    assert kway_pseudo_f(same) == (0.0, 2)
    assert pseudo_f(same, bipartition(same)) == 0.0


@settings(max_examples=100, deadline=None)
@given(m=st.integers(3, 30), seed=st.integers(0, 2**32 - 1))
def test_kway_pseudo_f_is_the_best_cut_of_the_merge_tree(m: int, seed: int) -> None:
    """Against a direct computation: every cut of SciPy's tree into k parts, scored one by one."""
    from scipy.cluster.hierarchy import fcluster

    from fedflock.clustering.bipartition import merge_tree

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(m, 8)) + 2 * np.eye(4, 8)[rng.integers(0, 4, m)]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sim = x @ x.T
    tree = merge_tree(sim)
    scores = {}
    for k in range(2, max_parts(m) + 1):
        labels = fcluster(tree, k, "maxclust")
        if len(np.unique(labels)) == k:  # ties can make SciPy's cut coarser
            scores[k] = _cut_pseudo_f(sim, [np.flatnonzero(labels == c) for c in np.unique(labels)])
    best, best_k = kway_pseudo_f(sim)
    assert best == pytest.approx(max(scores.values()), rel=1e-9)
    assert scores[best_k] == pytest.approx(best, rel=1e-9)
    assert best >= pseudo_f(sim, bipartition(sim)) * (1 - 1e-12)  # the bipartition is one cut


def test_kway_pseudo_f_keeps_its_power_when_a_window_mixes_many_groups() -> None:
    """16 updates of 8 groups, two each: the bipartition's pseudo-F cannot pass 3.5 even without
    noise ((n - 2) / (K - 2) = 2.3); the best cut (into the 8 groups) stands far above it, while
    structureless updates score about 1 on either statistic."""
    rng = np.random.default_rng(0)
    directions = rng.normal(size=(8, 5000))
    groups = np.repeat(np.arange(8), 2)
    updates = directions[groups] + 0.3 * rng.normal(size=(16, 5000))
    sim = cosine_matrix(torch.from_numpy(updates)).numpy()
    assert pseudo_f(sim, bipartition(sim)) < 3.0
    best, k = kway_pseudo_f(sim)
    assert best > 10 and k == 8
    noise = cosine_matrix(torch.from_numpy(rng.normal(size=(60, 5000)))).numpy()
    assert 0.8 < kway_pseudo_f(noise)[0] < 1.5
    assert kway_pseudo_f(noise[:2, :2]) == (0.0, 2)


def test_split_stats_on_two_groups_recovers_them() -> None:
    updates = _two_directions(10, 200, noise=0.3, seed=2)
    sim = cosine_matrix(updates).numpy()
    weights = np.arange(1.0, 11.0)
    stats = split_stats(gram_matrix(updates).numpy(), weights, sim)
    assert stats.parts == ([0, 2, 4, 6, 8], [1, 3, 5, 7, 9])
    assert stats.alpha_cross_max < stats.alpha_intra_min and stats.gap > 0
    assert 0 <= stats.gamma_max < 1
    assert math.isclose(stats.gamma_bound, math.sqrt((1 - stats.alpha_cross_max) / 2))
    assert stats.max_norm >= stats.mean_norm
    # The Gram-matrix shortcuts equal the direct definitions.
    w = torch.tensor(weights)
    assert math.isclose(stats.mean_norm, float((updates * w[:, None]).sum(0).norm() / w.sum()),
                        rel_tol=1e-9)
    assert math.isclose(stats.max_norm, float(updates.norm(dim=1).max()), rel_tol=1e-9)
    gammas = []
    for part in stats.parts:
        idx = torch.tensor(part)
        mean = (updates[idx] * w[idx, None]).sum(0) / w[idx].sum()
        gammas += ((updates[idx] - mean).norm(dim=1) / updates[idx].norm(dim=1)).tolist()
    assert math.isclose(stats.gamma_max, max(gammas), rel_tol=1e-7)


def test_a_split_makes_the_cut_the_statistic_scored_or_the_bipartition() -> None:
    updates = groups_and_outliers([8, 8], 2)
    sim = cosine_matrix(updates).numpy()
    stats = split_stats(gram_matrix(updates).numpy(), np.ones(18), sim)
    assert stats.kway_k == 3 and [17] in stats.kway_parts  # the groups and an outlier apart
    assert stats.split("kway", "cut") == stats.kway_parts
    # the bipartition (CFL's paper) whenever it is asked for or is what was scored
    assert stats.split("kway", "two") == stats.split("bipartition", "cut") == list(stats.parts)
    assert len(stats.parts) == 2


LEFT = torch.tensor([[1.0, 0.1], [0.9, 0.0]])  # the updates a parameter-tree edge keeps
RIGHT = torch.tensor([[0.0, 1.0], [0.1, 0.9]])


def _tree_split_in_two() -> ParameterTree:
    tree = ParameterTree()
    tree.add_root(0, [0, 1, 2, 3])
    tree.record_split(0, 5, torch.zeros(2), [(1, [0, 1], LEFT), (2, [2, 3], RIGHT)])
    return tree


class _Updating:
    """A newcomer whose update is the same wherever it is asked."""

    id = 0

    def __init__(self, update: list[float]) -> None:
        self.update = torch.tensor(update)

    def update_at(self, params: torch.Tensor) -> torch.Tensor:
        return self.update

    def run(self, task):  # a tree asks for updates only
        raise AssertionError("not asked")


def test_parameter_tree_routes_a_client_along_the_most_similar_edge() -> None:
    tree = _tree_split_in_two()
    leaf, path = tree.route(_Updating([0.05, 1.0]))
    assert leaf == 2 and path[0]["chosen"] == 2
    leaf, _ = tree.route(_Updating([1.0, -0.1]))
    assert leaf == 1
    restored = ParameterTree.from_dict(tree.to_dict())
    assert restored.leaves() == [1, 2] and restored.root == 0

