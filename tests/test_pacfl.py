"""PACFL: the subspace angles it clusters by, its one clustering round (every client asked,
the automatic rule finding groups and keeping an IID federation whole, `clusters: K`), clients
absent at the clustering placed by their bases, and newcomers placed by `fedflock assign`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedflock.api import run
from fedflock.assign import assign_new_clients
from fedflock.similarity.subspaces import class_angles, subspace_distance
from tests.conftest import small_config


def _basis(*columns: list[float]) -> torch.Tensor:
    return torch.tensor(columns, dtype=torch.float64).T[None]  # (1, d, p)


def test_the_principal_angle_sees_one_subspace_where_the_elementwise_angle_sees_45_degrees(
        ) -> None:
    plane = _basis([1, 0, 0], [0, 1, 0])
    r = 1 / math.sqrt(2)
    turned = _basis([r, r, 0], [r, -r, 0])  # the same plane, other basis vectors
    assert float(class_angles(plane, turned)) == pytest.approx(0, abs=1e-5)
    assert float(class_angles(plane, turned, "elementwise")) == pytest.approx(45)
    assert float(class_angles(plane, _basis([0, 0, 1], [0, 0, 0]))) == pytest.approx(90)
    assert float(class_angles(plane, -plane)) == pytest.approx(0, abs=1e-5)  # signs are free


def test_the_distance_averages_the_shared_classes_and_is_90_without_one() -> None:
    x, y = _basis([1, 0]), _basis([0, 1])
    bases = torch.stack([torch.cat([x, x]), torch.cat([x, y]), torch.cat([y, y])])  # (3, C=2, d, p)
    counts = torch.tensor([[5.0, 5.0], [5.0, 0.0], [0.0, 5.0]])
    d = subspace_distance(bases, counts, bases, counts)
    assert float(d[0, 1]) == pytest.approx(0, abs=1e-5)  # class 1 is client 0's only: left out
    assert float(d[0, 2]) == pytest.approx(90)  # class 1 only, orthogonal bases
    assert float(d[1, 2]) == pytest.approx(90)  # no class in common


def _pacfl(tmp_path: Path, name: str, **overrides: object) -> dict:
    raw = small_config(**{"data.clients": 12, "rounds": 3, "algorithm": {"name": "pacfl"},
                          **overrides})
    return run(raw, tmp_path / name).summary


def test_one_clustering_round_asks_everyone_and_finds_the_groups(tmp_path: Path) -> None:
    summary = _pacfl(tmp_path, "groups", **{"participation.fraction": 0.25})
    (decision,) = summary["splits"]
    assert decision["kind"] == "cluster" and decision["round"] == 1
    assert sorted(decision["sizes"]) == [6, 6] and summary["ari"] == pytest.approx(1.0)
    assert decision["neighbours"] == 2 and decision["max_within"] < decision["min_between"]
    lines = [json.loads(x) for x in (tmp_path / "groups" / "metrics.jsonl").read_text()
             .splitlines()]
    assert [m["participants"] for m in lines] == [12, 3, 3]  # all bases, then the sample
    with np.load(tmp_path / "groups" / "splits" / "split_00.npz") as saved:
        assert saved["similarity"].shape == (12, 12)


def test_an_iid_federation_stays_whole_and_k_cuts_the_dendrogram(tmp_path: Path) -> None:
    iid = _pacfl(tmp_path, "iid", **{"data.scenario": {"kind": "iid"}})
    assert iid["num_clusters"] == 1
    three = _pacfl(tmp_path, "k3", **{"algorithm": {"name": "pacfl", "clusters": 3}})
    assert three["num_clusters"] == 3 and three["splits"][0]["linkage"] == "average"


def test_newcomers_join_their_groups_cluster_from_their_bases_alone(tmp_path: Path) -> None:
    _pacfl(tmp_path, "trained")
    before = (tmp_path / "trained" / "checkpoints").stat().st_mtime_ns
    result = assign_new_clients(tmp_path / "trained", clients=6, seed=5)
    assert result["routed_correctly"] == 1.0 and result["ari"] == 1.0
    assert all(len(r["route"]["nearest"]) == 2 for r in result["clients"])
    assert (tmp_path / "trained" / "checkpoints").stat().st_mtime_ns == before  # nobody retrained


def test_a_basis_of_another_shape_than_the_data_description_is_refused() -> None:
    from fedflock.client.tasks import Basis
    from fedflock.wire import InvalidReply, Reply

    task = Basis(0, 1, rank=3, classes=10, dim=64)
    good = Reply(0, {"basis": torch.zeros(10, 64, 3), "counts": torch.ones(10)}, {}, 10)
    task.check(good)
    for shape in ((10, 63, 3), (9, 64, 3), (10, 64, 2)):
        bad = Reply(0, {"basis": torch.zeros(*shape), "counts": torch.ones(shape[0])}, {}, 10)
        with pytest.raises(InvalidReply, match="expected \\(10, 64, 3\\)"):
            task.check(bad)
