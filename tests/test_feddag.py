"""FedDAG: bases in round 1, a warm-up every client trains, one clustering on the fused data
and gradient similarity, and with a dual encoder the secondary encoder refined by the
complementary clusters' updates; newcomers placed by their bases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedflock.api import run
from fedflock.assign import assign_new_clients
from fedflock.engines.embedded import EmbeddedEngine
from fedflock.experiment import build_algorithm
from fedflock.validation import validate
from fedflock.wire import Reply
from tests.conftest import small_config

DAG = {"data.clients": 12, "data.samples_per_client": 80, "rounds": 5,
       "participation.fraction": 0.25,
       "algorithm": {"name": "feddag", "warmup_rounds": 2}}


def test_bases_then_a_warm_up_of_everyone_then_one_fused_clustering(tmp_path: Path) -> None:
    summary = run(small_config(**DAG), tmp_path / "run").summary
    (decision,) = summary["splits"]
    assert decision["kind"] == "cluster" and decision["round"] == 3
    assert sorted(decision["sizes"]) == [6, 6] and summary["ari"] == pytest.approx(1.0)
    weight = decision["gradient_weight"]
    assert 0 <= weight["min"] <= weight["mean"] <= weight["max"] <= 1
    assert decision["sparsify"] == "random" and decision["keep"] == 0.02
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text()
             .splitlines()]
    assert [m["participants"] for m in lines] == [12, 12, 12, 3, 3]
    joined = assign_new_clients(tmp_path / "run", 4)  # placed by their bases alone
    assert joined["routed_correctly"] == 1.0


def test_the_secondary_encoder_also_averages_the_complementary_clusters_updates() -> None:
    config = validate(small_config(**DAG, **{"model": {"name": "mlp", "hidden": [8],
                                                       "dual_encoder": True}}))
    engine = EmbeddedEngine.from_config(config)
    try:
        algorithm = build_algorithm(config, engine)
        rnd = 0
        while not algorithm.clustered:  # bases, the warm-up and the clustering
            rnd += 1
            clients = algorithm.participants(rnd, [0, 1, 2])
            algorithm.aggregate_train(rnd, engine.run_tasks(
                rnd, algorithm.configure_train(rnd, clients)))
        first, second = algorithm._clusters
        assert algorithm.complements == {first.id: [second.id], second.id: [first.id]}
        secondary = algorithm.secondary
        before = {k.id: k.params.clone() for k in (first, second)}
        a, b = first.members[0], second.members[0]
        size = len(before[first.id])
        algorithm.configure_train(rnd + 1, [a, b])
        replies = [Reply(a, {"update": torch.full((size,), 1.0)}, {"loss": 0.0}, 10),
                   Reply(b, {"update": torch.full((size,), 4.0)}, {"loss": 0.0}, 30)]
        algorithm.aggregate_train(rnd + 1, replies)
        moved = first.params - before[first.id]
        assert torch.allclose(moved[~secondary], torch.ones(int((~secondary).sum())))
        shared = (10 * 1.0 + 30 * 4.0) / 40  # its own member and the complement's, by examples
        assert torch.allclose(moved[secondary], torch.full((int(secondary.sum()),), shared))
    finally:
        engine.close()


@pytest.mark.parametrize("similarity, weight", [("data", 0.0), ("gradient", 1.0)])
def test_one_signal_alone_clusters_with_its_weight_recorded(similarity: str,
                                                             weight: float) -> None:
    summary = run(small_config(**{**DAG, "algorithm": {
        "name": "feddag", "warmup_rounds": 2, "similarity": similarity}})).summary
    (decision,) = summary["splits"]
    assert decision["gradient_weight"] == {"mean": weight, "min": weight, "max": weight}
    assert summary["ari"] == pytest.approx(1.0)
