"""Neighbour lists instead of the n x n matrix: the incremental store for many clients, its
k-nearest-neighbour graph, and incremental clustering on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedflock.algorithms.incremental import neighbours_for
from fedflock.clustering.communities import (
    affinity,
    block_means,
    knn_affinity,
    louvain,
    merge_close,
)
from fedflock.experiment import run_experiment
from fedflock.similarity.incremental import IncrementalSimilarity
from fedflock.validation import validate
from tests.conftest import small_config

rounds = st.lists(st.sets(st.integers(0, 19), min_size=1, max_size=6), min_size=1, max_size=10)


@settings(max_examples=60, deadline=None)
@given(rounds, st.sampled_from(["cosine", "euclidean", "manhattan"]), st.integers(0, 2**31))
def test_lists_hold_current_values_and_a_sampled_clients_exact_nearest(
        batches: list[set[int]], measure: str, seed: int) -> None:
    """Every listed pair holds the value of the two clients' latest updates (nothing stale),
    each list is best first, and the clients sampled last list exactly their k closest."""
    gen = torch.Generator().manual_seed(seed)
    k = 4
    dense, lists = IncrementalSimilarity(measure), IncrementalSimilarity(measure, neighbours=k)
    for batch in batches:
        clients = sorted(batch)
        updates = torch.randn(len(clients), 6, generator=gen) + 0.1
        dense.add(clients, updates)
        lists.add(clients, updates)
    seen, values = dense.values()
    _, index, value = lists.neighbour_lists()
    assert seen == lists.clients
    better = (lambda a, b: a >= b - 1e-5) if dense.is_similarity else (lambda a, b: a <= b + 1e-5)
    for row in range(len(seen)):
        listed = [int(j) for j in index[row] if j >= 0]
        assert row not in listed and len(set(listed)) == len(listed)
        got = value[row, : len(listed)]
        assert torch.allclose(got, values[row, listed], atol=1e-4, rtol=1e-4)
        assert all(better(a, b) for a, b in zip(got.tolist(), got.tolist()[1:], strict=False))
    for client in sorted(batches[-1]):
        row = lists.slot[client]
        others = torch.cat([values[row, :row], values[row, row + 1 :]])
        best = torch.topk(others, min(k, len(others)), largest=dense.is_similarity).values
        assert torch.allclose(value[row, : len(best)], best, atol=1e-4, rtol=1e-4)


def test_lists_take_memory_linear_in_the_clients() -> None:
    store = IncrementalSimilarity("cosine", neighbours=8)
    store.add(list(range(4000)), torch.randn(4000, 16))
    assert store.matrix.numel() == 0
    assert store.lists.nbytes <= 4096 * 8 * 12  # index (8 bytes) + value (4 bytes) per entry
    with pytest.raises(RuntimeError, match="neighbour lists"):
        store.values()


def test_k_grows_with_the_log_of_the_clients() -> None:
    assert neighbours_for(100_000) == 35 and neighbours_for(20) == 9 and neighbours_for(2) == 7


def _points(sizes: list[int], spread: float, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(len(sizes), 30, generator=gen)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    return centres[labels] + spread * torch.randn(len(labels), 30, generator=gen), labels


@pytest.mark.parametrize("measure", ["cosine", "euclidean"])
def test_the_knn_graph_finds_the_blocks_and_its_merge_test_the_dense_one(measure: str) -> None:
    points, labels = _points([60, 40, 30], spread=0.3)
    store = IncrementalSimilarity(measure, neighbours=12)
    store.add(list(range(len(points))), points)
    _, index, value = store.neighbour_lists()
    graph = knn_affinity(index.numpy(), value.numpy(), store.is_similarity)
    assert graph.nnz <= 2 * 12 * len(points) and (graph != graph.T).nnz == 0
    found = louvain(graph)
    truth = sorted(np.flatnonzero(labels == g).tolist() for g in range(3))
    assert sorted(merge_close(graph, found.parts, 0.25)) == truth or sorted(found.parts) == truth
    # the merge statistic on sampled pairs is the dense graph's (whole matrix, here exact)
    dense = IncrementalSimilarity(measure)
    dense.add(list(range(len(points))), points)
    full = affinity(dense.values()[1].numpy(), dense.is_similarity)
    rows = list(range(len(points)))
    among = affinity(store.among(rows).numpy(), store.is_similarity,
                     None if store.is_similarity else np.sort(
                         np.where(np.eye(len(rows), dtype=bool), np.inf,
                                  store.among(rows).numpy()), axis=1)[:, 6])
    assert np.allclose(block_means(among, truth), block_means(full, truth), atol=1e-5)


PARTIAL = {"data.clients": 40, "data.scenario.groups": 4, "rounds": 40,
           "data.samples_per_client": 60, "participation.fraction": 0.25,
           "training.local_epochs": 2, "model.hidden": [64], "checkpoint_every": 10}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_incremental_on_neighbour_lists_finds_the_groups_and_keeps_iid_together(
        tmp_path: Path) -> None:
    def run(name: str, **extra: object) -> dict:
        raw = small_config(**{**PARTIAL, **extra})
        return run_experiment(validate(raw), tmp_path / name, quiet=True)

    lists = {"name": "incremental", "neighbours": 9}
    grouped = run("groups", algorithm=lists)
    assert grouped["ari"] == 1.0 and grouped["num_clusters"] == 4
    assert not list((tmp_path / "groups" / "splits").glob("*.npz"))  # no n x n matrix kept
    iid = run("iid", algorithm=lists, **{"data.scenario.kind": "iid", "data.scenario.groups": 1})
    assert iid["num_clusters"] == 1
