"""DistFL's mechanics on real data (scikit-learn digits, the small BN ConvNet): a clustering
round synthesises inputs that really move, records its divergences, and its partition is exactly
the connected components of those divergences under the recorded rule (k nearest neighbours by
default, the paper's threshold when given); a model without BatchNorm is a config error.
(Whether the clusters are the right ones is what the DistFL tables of `benchmarks/reproduce.py`
measure.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedflock.clustering.threshold import neighbour_components, threshold_components
from fedflock.errors import ConfigError
from fedflock.experiment import run_experiment
from fedflock.validation import validate
from tests.conftest import small_config


def _config(kind: str, **overrides: object) -> dict:
    return small_config(**{
        "rounds": 6, "data.clients": 8, "data.samples_per_client": 150,
        "data.scenario": {"kind": kind, "groups": 2}, "model": {"name": "cnn_bn"},
        "training.local_epochs": 3, "training.lr": 0.1, "checkpoint_every": 6,
        "algorithm": {"name": "distfl", "warmup_rounds": 4, "recluster_every": 2,
                      "synthetic": 64, "steps": 100},
        **overrides})


@pytest.mark.parametrize("threshold", [None, 0.2])
def test_a_clustering_round_is_the_components_of_its_divergences(
        tmp_path: Path, threshold: float | None) -> None:
    raw = _config("feature_skew")
    raw["algorithm"]["threshold"] = threshold
    summary = run_experiment(validate(raw), tmp_path / "run", quiet=True)
    decisions = summary["splits"]
    assert [(d["kind"], d["round"]) for d in decisions] == [("cluster", 4), ("cluster", 6)]
    for index, decision in enumerate(decisions):
        first, last = decision["synthesis_loss"]
        assert last <= first / 10  # the inputs moved
        with np.load(tmp_path / "run" / "splits" / f"split_{index:02d}.npz") as saved:
            members = [int(m) for m in saved["members"]]
            divergence = -np.log(saved["similarity"]) * decision["scale"]
        parts = (neighbour_components(divergence, decision["neighbours"]) if threshold is None
                 else threshold_components(divergence, decision["threshold"]))
        assert [[members[i] for i in part] for part in parts] == decision["members"]
    assert sorted(c for part in summary["clusters"] for c in part) == list(range(8))


def test_distfl_needs_batch_norm(tmp_path: Path) -> None:
    raw = _config("iid", model={"name": "mlp", "hidden": [16]})
    with pytest.raises(ConfigError, match="BatchNorm"):
        run_experiment(validate(raw), tmp_path / "run", quiet=True)
