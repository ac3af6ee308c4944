"""What a run keeps is bounded: the CFL tree keeps a fixed number of updates per edge, similarity
matrices leave memory and checkpoints for splits/ as soon as they are decided (tested with the CFL
split in test_algorithms) and are not kept beyond a size, and incremental clustering drops its
n x n store once it has clustered."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedflock.algorithms.base import MAX_SAVED_MATRIX, Cluster, Decision
from fedflock.clustering import ParameterTree
from fedflock.experiment import run_experiment
from fedflock.validation import validate
from tests.conftest import make_algorithm, small_config


def _directions(groups: int, per_group: int, dim: int = 50, seed: int = 0) -> torch.Tensor:
    """`per_group` noisy copies of each of `groups` random unit directions, group by group."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(groups, dim, generator=gen)
    return torch.cat([c + 0.3 * torch.randn(per_group, dim, generator=gen) for c in centres])


def test_tree_keeps_a_bounded_spread_of_updates_and_still_routes() -> None:
    updates = _directions(2, 200)
    tree = ParameterTree(max_edge_updates=16)
    tree.add_root(0, list(range(400)))
    tree.record_split(0, 5, torch.zeros(50), [(1, list(range(200)), updates[:200]),
                                              (2, list(range(200, 400)), updates[200:])])
    assert [len(u) for u in tree.nodes[0].edge_updates.values()] == [16, 16]
    for client in range(400):  # every member's own update still leads to its own edge
        assert tree.step(0, updates[client])[0] == (1 if client < 200 else 2)
    restored = ParameterTree.from_dict(tree.to_dict(), 16)
    assert restored.max_edge_updates == 16


def test_a_large_decision_matrix_is_not_kept() -> None:
    algorithm = make_algorithm("fedavg", 4, 3)
    n = MAX_SAVED_MATRIX + 1
    algorithm.record(Decision("split", 1, 0, [1, 2], [[0], [1]],
                              matrix=(list(range(n)), np.zeros((1, 1)))))
    algorithm.record(Decision("split", 2, 1, [3, 4], [[0], [1]],
                              matrix=([0, 1], np.eye(2))))
    assert [d.matrix is None for d in algorithm.decisions] == [True, False]


def test_a_decision_keeps_its_record_apart_from_its_figures() -> None:
    with pytest.raises(ValueError, match="members"):
        Decision("split", 1, 0, [1, 2], [[0], [1]], {"members": 2})
    state = Decision("split", 1, 0, [1, 2], [[0], [1]], {"kway_f": 5.0}).to_state()
    state["figures"]["members"] = 9  # a figure named like the record's own key is refused
    with pytest.raises(ValueError, match="members"):
        Decision.from_state(state)


def test_the_cluster_tree_follows_recorded_splits_down_to_the_current_clusters() -> None:
    algorithm = make_algorithm("fedavg", 6, 3)
    model = algorithm._clusters[0].params
    algorithm.record(Decision("split", 4, 0, [1, 2], [[0, 1, 2], [3, 4]]))
    algorithm.record(Decision("split", 9, 1, [3, 4], [[0, 1], [2]]))  # 1 split again
    algorithm._clusters = [Cluster(3, [0, 1], model), Cluster(4, [2], model),
                           Cluster(2, [3, 4], model)]  # client 5 still waits
    tree = {node["id"]: node for node in algorithm.tree()}
    assert tree[0] == {"id": 0, "parent": None, "members": [0, 1, 2, 3, 4],  # 5 is waiting
                       "split_round": 4, "children": [1, 2]}
    assert tree[1]["members"] == [0, 1, 2] and tree[1]["split_round"] == 9
    assert [tree[c]["parent"] for c in (3, 4, 2)] == [1, 1, 0]
    assert not tree[2]["children"] and tree[2]["split_round"] is None
    assert make_algorithm("fedavg", 6, 3).tree() is None  # no split: no tree


def test_incremental_drops_its_store_after_clustering(tmp_path: Path) -> None:
    raw = small_config(rounds=6, algorithm={"name": "incremental", "cluster_round": 3,
                                            "min_coverage": 0.0}, **{"data.clients": 8})
    summary = run_experiment(validate(raw), tmp_path / "run", quiet=True)
    assert summary["splits"], "the scenario should cluster"
    store = torch.load(tmp_path / "run" / "checkpoints" / "last.pt",
                       weights_only=True)["algorithm"]["store"]
    assert store["matrix"].numel() == 0 and store["updates"].numel() == 0
    assert len(store["clients"]) == 8
