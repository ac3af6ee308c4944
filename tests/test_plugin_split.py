"""A plugin method that only says how to split (its `partition` returns the parts) gets its
split recorded like the built-in methods': in the summary's splits and tree, and in the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import Field
from sklearn.cluster import AgglomerativeClustering

from fedflock.algorithms import AlgorithmParams
from fedflock.algorithms.base import Cluster
from fedflock.algorithms.clustered import ClusteredAlgorithm, Split
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.experiment import run_experiment
from fedflock.report import make_report
from fedflock.validation import validate
from fedflock.wire import Reply
from tests.conftest import small_config


class OneShotParams(AlgorithmParams):
    at: int = Field(3, ge=1, description="round of the one clustering")
    clusters: int = Field(2, ge=2, description="clusters it makes")


@ALGORITHMS.register("test_one_shot", "FL+HC-like: one agglomerative clustering of updates")
class OneShot(ClusteredAlgorithm):
    name = "test_one_shot"
    Params = OneShotParams

    def partition(self, rnd: int, cluster: Cluster, replies: list[Reply],
                  diag: dict[str, Any]) -> Split | None:
        if rnd != self.params.at or len(replies) < self.params.clusters:
            return None
        updates = np.stack([r.update[: self.update_size].numpy() for r in replies])
        labels = AgglomerativeClustering(self.params.clusters, metric="cosine",
                                         linkage="average").fit_predict(updates)
        return Split([[r.client for r, k in zip(replies, labels, strict=True) if k == label]
                      for label in sorted(set(labels))])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_plugin_split_is_in_the_summary_the_tree_and_the_report(tmp_path: Path) -> None:
    raw = small_config(rounds=5, algorithm={"name": "test_one_shot"})
    summary = run_experiment(validate(raw), tmp_path / "run", quiet=True)
    assert summary["num_clusters"] == 2
    [split] = summary["splits"]
    assert split["kind"] == "split" and split["round"] == 3 and split["parent"] == 0
    assert split["children"] == [1, 2] and sum(split["sizes"]) == 6
    tree = {node["id"]: node for node in summary["tree"]}
    assert tree[0]["children"] == [1, 2] and tree[0]["split_round"] == 3
    assert sorted(tree[1]["members"] + tree[2]["members"]) == list(range(6))
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["splits"] == [split]
    assert make_report(tmp_path / "run")
    report = (tmp_path / "run" / "report" / "report.md").read_text()
    assert "| 1 | 3 | split | 0 → 1, 2 |" in report
    assert (tmp_path / "run" / "report" / "tree.png").exists()
