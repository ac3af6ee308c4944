"""FL+HC: one agglomerative clustering of the clients' updates after the warm-up (the automatic
cut finding the groups and keeping an IID federation whole, `clusters: K`, the paper's
threshold), clients absent at the clustering placed by their first update, and newcomers placed
by `fedflock assign`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedflock.api import run
from fedflock.assign import assign_new_clients
from fedflock.clustering.hierarchical import distance_parts, linkage_parts
from fedflock.errors import ConfigError
from fedflock.validation import validate
from tests.conftest import small_config


def _flhc(tmp_path: Path, name: str, params: dict | None = None, **overrides: object) -> dict:
    raw = small_config(**{"data.clients": 12, "rounds": 4,
                          "algorithm": {"name": "flhc", "warmup_rounds": 1, **(params or {})},
                          **overrides})
    return run(raw, tmp_path / name).summary


def test_the_clustering_round_follows_the_warmup_and_finds_the_groups(tmp_path: Path) -> None:
    summary = _flhc(tmp_path, "groups")
    (decision,) = summary["splits"]
    assert decision["kind"] == "cluster" and decision["round"] == 2
    assert sorted(decision["sizes"]) == [6, 6] and summary["ari"] == pytest.approx(1.0)
    assert decision["linkage"] == "ward" and decision["distance"] == "euclidean"
    assert decision["small_share"] == 0 and decision["score"] == decision["compactness"] < 1
    lines = [json.loads(x) for x in (tmp_path / "groups" / "metrics.jsonl").read_text()
             .splitlines()]
    assert [m["num_clusters"] for m in lines] == [1, 2, 2, 2]
    with np.load(tmp_path / "groups" / "splits" / "split_00.npz") as saved:
        assert saved["similarity"].shape == (12, 12)


def test_an_iid_federation_stays_whole_and_k_or_a_threshold_cut_the_dendrogram(
        tmp_path: Path) -> None:
    iid = _flhc(tmp_path, "iid", **{"data.scenario": {"kind": "iid"}})
    assert iid["num_clusters"] == 1 and iid["splits"][0]["score"] == 1.0
    three = _flhc(tmp_path, "k3", {"clusters": 3, "distance": "cosine", "linkage": "average"})
    assert three["num_clusters"] == 3 and three["splits"][0]["clusters"] == 3
    cut = _flhc(tmp_path, "cut", {"threshold": 1e-9})  # below every merge: singletons
    assert cut["num_clusters"] == 12 and cut["splits"][0]["threshold"] == 1e-9


def test_clients_absent_at_the_clustering_join_their_groups_cluster_by_their_update(
        tmp_path: Path) -> None:
    summary = _flhc(tmp_path, "partial", rounds=8, **{"participation.fraction": 0.5})
    (decision,) = summary["splits"]
    assert sum(decision["sizes"]) == 6  # the sample of the clustering round
    assert summary["num_clusters"] == 2 and summary["ari"] == pytest.approx(1.0)


def test_newcomers_join_their_groups_cluster_by_their_update_alone(tmp_path: Path) -> None:
    _flhc(tmp_path, "trained")
    before = (tmp_path / "trained" / "checkpoints").stat().st_mtime_ns
    result = assign_new_clients(tmp_path / "trained", clients=6, seed=5)
    assert result["routed_correctly"] == 1.0 and result["ari"] == 1.0
    assert all(len(r["route"]["mean_distance"]) == 2 for r in result["clients"])
    assert (tmp_path / "trained" / "checkpoints").stat().st_mtime_ns == before


def test_a_threshold_cuts_where_merges_pass_it() -> None:
    d = np.array([[0, 1, 5, 5], [1, 0, 5, 5], [5, 5, 0, 1], [5, 5, 1, 0]], dtype=float)
    assert distance_parts(d, 2.0) == [[0, 1], [2, 3]]
    assert distance_parts(d, 6.0) == [[0, 1, 2, 3]]
    assert linkage_parts(d, 2, "ward") == [[0, 1], [2, 3]]


@pytest.mark.parametrize(("params", "message"), [
    ({"clusters": 2, "threshold": 0.5}, "clusters or threshold, not both"),
    ({"linkage": "ward", "distance": "cosine"}, "ward' needs distance 'euclidean'"),
])
def test_inconsistent_parameters_are_one_config_error(params: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from fedflock.algorithms import validate_params

        validate_params(validate(small_config(algorithm={"name": "flhc", **params})).algorithm)
