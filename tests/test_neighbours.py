"""Neighbour lists instead of the n x n matrix: the incremental store for many clients, its
k-nearest-neighbour graph, and incremental clustering on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedflock.clustering.communities import (
    affinity,
    block_means,
    louvain,
    merge_close,
    nested_communities,
)
from fedflock.clustering.stored_updates import neighbours_for, store_graph
from fedflock.experiment import run_experiment
from fedflock.similarity.incremental import IncrementalSimilarity
from fedflock.similarity.neighbours import NeighbourLists
from fedflock.validation import validate
from tests.conftest import make_algorithm, small_config

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
    centres = 2 * torch.eye(30)[torch.randperm(30, generator=gen)[: len(sizes)]]
    labels = np.repeat(np.arange(len(sizes)), sizes)
    return centres[labels] + spread * torch.randn(len(labels), 30, generator=gen), labels


@pytest.mark.parametrize("measure", ["cosine", "euclidean"])
def test_the_knn_graph_finds_the_blocks_and_the_sampled_merge_test_agrees_with_the_matrix(
        measure: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import fedflock.clustering.stored_updates as stored_updates

    points, labels = _points([60, 40, 30], spread=0.3)
    truth = sorted(np.flatnonzero(labels == g).tolist() for g in range(3))
    monkeypatch.setattr(stored_updates, "MERGE_SAMPLE", 30)  # 20 sampled members per community
    algorithm = make_algorithm("incremental", len(points), points.shape[1],
                               similarity=measure, neighbours=12)
    algorithm.store.add(list(range(len(points))), points)
    found_graph = store_graph(algorithm.store)
    graph, means, matrix = found_graph.weights, found_graph.means, found_graph.matrix
    assert matrix is None and graph.nnz <= 2 * 12 * len(points) and (graph != graph.T).nnz == 0
    found = louvain(graph)
    assert sorted(merge_close(means, found.parts, 0.25)) == truth
    assert sorted(nested_communities(graph, means, 0.25).parts) == truth  # on sparse subgraphs
    # the sampled statistic estimates the whole matrix's (which a dense store computes)
    dense = IncrementalSimilarity(measure)
    dense.add(list(range(len(points))), points)
    full = block_means(affinity(dense.values()[1].numpy(), dense.is_similarity), truth)
    assert np.allclose(means(truth), full, rtol=0.25, atol=0.02)
    # a uniform cloud cut by Louvain is put back together by the same test
    cloud, _ = _points([130], spread=0.3, seed=1)
    algorithm = make_algorithm("incremental", len(cloud), cloud.shape[1], similarity=measure,
                               neighbours=12)
    algorithm.store.add(list(range(len(cloud))), cloud)
    cloud_graph = store_graph(algorithm.store)
    graph, means = cloud_graph.weights, cloud_graph.means
    found = louvain(graph)
    assert len(found.parts) > 1 and merge_close(means, found.parts, 0.25) == [list(range(130))]
    assert nested_communities(graph, means, 0.25).parts == [list(range(130))]


def test_lists_survive_a_checkpoint_and_never_hold_an_unknown_value() -> None:
    gen = torch.Generator().manual_seed(3)
    whole = IncrementalSimilarity("euclidean", neighbours=5)
    whole.add(list(range(30)), torch.randn(30, 8, generator=gen))
    restored = IncrementalSimilarity.from_state(whole.state_dict())
    later = torch.randn(10, 8, generator=gen)
    whole.add(list(range(20, 40)), torch.cat([later, later]))
    restored.add(list(range(20, 40)), torch.cat([later, later]))
    assert all(torch.equal(a, b) for a, b in zip(whole.neighbour_lists()[1:],
                                                    restored.neighbour_lists()[1:], strict=True))
    lists = NeighbourLists(3, is_similarity=False)
    block = torch.tensor([[0.0, -float("inf"), 2.0, float("nan"), 1.0]])
    lists.update(torch.tensor([0]), block)
    index, value = lists.lists(5)
    assert index[0].tolist() == [4, 2, -1] and torch.isfinite(value[0, :2]).all()


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
