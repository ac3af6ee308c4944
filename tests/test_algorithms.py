"""Server logic: FedAvg/Local/fine-tuning/oracle, CFL splits, masking, gradients, assignment."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedflock.algorithms import ALGORITHMS
from fedflock.assign import assign_new_clients
from fedflock.errors import FedflockError
from fedflock.experiment import Run, run_experiment, without_timings
from fedflock.validation import validate
from tests.conftest import small_config

# Six clients in two label-permutation groups split reliably within a few rounds.
CFL_FAST = {"name": "cfl", "warmup_rounds": 2, "patience": 2}


def _split_config(**overrides: object) -> dict:
    base = {"rounds": 12, "data.clients": 8, "data.samples_per_client": 60,
            "training.local_epochs": 2, "algorithm": dict(CFL_FAST)}
    return small_config(**(base | overrides))


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_cfl_splits_two_label_groups_into_a_partition(tmp_path: Path) -> None:
    summary = run_experiment(validate(_split_config()), tmp_path / "cfl", quiet=True)
    assert summary["splits"], "CFL should split two label-permutation groups"
    assert summary["ari"] == 1.0
    flat = sorted(c for cluster in summary["clusters"] for c in cluster)
    assert flat == list(range(8))
    for split in summary["splits"]:  # every split partitions its parent's client ids
        parent = next(n for n in summary["tree"] if n["id"] == split["parent"])
        assert sorted(c for part in split["members"] for c in part) == sorted(parent["members"])
        assert split["kway_f"] > 3.5  # the statistic the default rule decides by
    assert (tmp_path / "cfl" / "splits" / "split_00.npz").is_file()
    # The matrices left memory when written: the checkpoint holds none.
    state = torch.load(tmp_path / "cfl" / "checkpoints" / "last.pt", weights_only=True)
    assert all(d["matrix"] is None for d in state["algorithm"]["decisions"])


def test_cfl_splits_four_groups_at_once_into_the_cut_that_decided(tmp_path: Path) -> None:
    """12 clients of 4 groups: the window's bipartition scores below the threshold (2.9), the
    cut into the 4 groups above it (6.3); `split_into: cut` makes those 4 clusters at once."""
    raw = _split_config(**{"data.clients": 12, "data.scenario.groups": 4, "rounds": 6,
                           "data.samples_per_client": 100},
                        algorithm=CFL_FAST | {"split_into": "cut", "warmup_rounds": 4})
    summary = run_experiment(validate(raw), tmp_path / "cfl", quiet=True)
    first = summary["splits"][0]
    assert first["kway_k"] == 4 and len(first["children"]) == 4 and len(summary["splits"]) == 1
    assert first["pseudo_f"] < 3.5 < first["kway_f"]
    assert summary["ari"] == 1.0 and summary["num_clusters"] == 4
    root = next(n for n in summary["tree"] if n["parent"] is None)
    assert sorted(root["children"]) == sorted(first["children"])
    # a cut that would pass max_clusters falls back to the bipartition
    raw["algorithm"]["max_clusters"] = 2
    capped = run_experiment(validate(raw), tmp_path / "capped", quiet=True)
    assert capped["num_clusters"] == 2 and len(capped["splits"][0]["children"]) == 2


def test_cfl_equals_fedavg_until_its_first_split(tmp_path: Path) -> None:
    cfl = run_experiment(validate(_split_config()), tmp_path / "cfl", quiet=True)
    fedavg = run_experiment(validate(_split_config(algorithm={"name": "fedavg"})),
                            tmp_path / "fedavg", quiet=True)
    first = cfl["splits"][0]["round"]
    a, b = _metrics(tmp_path / "cfl"), _metrics(tmp_path / "fedavg")
    for ra, rb in zip(a[: first - 1], b[: first - 1], strict=True):
        assert ra["accuracy"] == rb["accuracy"]
    assert a[first]["accuracy"] != b[first]["accuracy"]
    assert fedavg["num_clusters"] == 1 and fedavg["splits"] == []


def test_cfl_never_splits_iid_clients(tmp_path: Path) -> None:
    raw = _split_config(**{"data.scenario": {"kind": "iid"}, "rounds": 15})
    summary = run_experiment(validate(raw), tmp_path / "iid", quiet=True)
    assert summary["num_clusters"] == 1


def test_masking_hides_every_update_and_changes_nothing(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[bool, list[torch.Tensor]] = {True: [], False: []}
    original = ALGORITHMS.get("cfl").aggregate_train

    def spy(self, rnd, replies):  # records what the server code receives
        seen[self._masked].extend(r.update.clone() for r in replies)
        return original(self, rnd, replies)

    summaries = {}
    for masked in (False, True):
        monkeypatch.setattr(ALGORITHMS.get("cfl"), "_masked", masked, raising=False)
        monkeypatch.setattr(ALGORITHMS.get("cfl"), "aggregate_train", spy)
        raw = _split_config(privacy={"masking": masked, "mask_seed": 7})
        summaries[masked] = run_experiment(validate(raw), tmp_path / str(masked), quiet=True)
    assert summaries[True]["splits"]
    plain, hidden = torch.stack(seen[False]), torch.stack(seen[True])
    assert plain.shape == hidden.shape
    for p, h in zip(plain, hidden, strict=True):  # never the plain vector, always a permutation
        assert not torch.equal(p, h)
        assert torch.equal(torch.sort(p).values, torch.sort(h).values)
    a, b = without_timings(summaries[False]), without_timings(summaries[True])
    assert a["clusters"] == b["clusters"] and a["accuracy"] == b["accuracy"]
    # Split figures come from a float32 Gram matrix whose summation order the permutation
    # changes: equal up to rounding, while the decisions and every model are identical.
    assert [s["round"] for s in a["splits"]] == [s["round"] for s in b["splits"]]
    for sa, sb in zip(a["splits"], b["splits"], strict=True):
        assert sa["pseudo_f"] == pytest.approx(sb["pseudo_f"], rel=1e-5)


def test_gradient_variant_runs_and_still_splits(tmp_path: Path) -> None:
    algo = dict(CFL_FAST, update="gradients")
    summary = run_experiment(validate(_split_config(algorithm=algo, rounds=20)),
                             tmp_path / "g", quiet=True)
    assert summary["splits"] and summary["ari"] == 1.0


def test_eps_rule_with_gamma_check_records_the_papers_figures(tmp_path: Path) -> None:
    algo = {"name": "cfl", "split_rule": "eps", "eps1": 10.0, "eps2": 0.01, "warmup_rounds": 2,
            "gamma_check": False}
    summary = run_experiment(validate(_split_config(algorithm=algo)), tmp_path / "e", quiet=True)
    assert summary["splits"]
    split = summary["splits"][0]
    assert split["mean_norm"] < 10.0 and split["max_norm"] > 0.01
    assert {"gamma_max", "gamma_bound", "alpha_intra_min", "alpha_cross_max", "gap"} <= set(split)
    strict = dict(algo, gamma_check=True)
    gated = run_experiment(validate(_split_config(algorithm=strict)), tmp_path / "s", quiet=True)
    for s in gated["splits"]:
        assert s["gamma_max"] < s["gamma_bound"]


def test_assign_routes_new_clients_to_their_groups_cluster(tmp_path: Path) -> None:
    out = tmp_path / "run"
    summary = run_experiment(validate(_split_config(rounds=14)), out, quiet=True)
    assert summary["num_clusters"] == 2
    result = assign_new_clients(out, clients=6, seed=99)
    assert result["routed_correctly"] == 1.0
    assert len(result["clients"]) == 6


@pytest.mark.parametrize("name", ["fedavg", "local", "fedavg_ft", "oracle"])
def test_baselines_run_and_report_a_partition(tmp_path: Path, name: str) -> None:
    summary = run_experiment(validate(small_config(algorithm={"name": name})), tmp_path / name,
                             quiet=True)
    clusters = summary["clusters"]
    assert sorted(c for cl in clusters for c in cl) == list(range(6))
    expected = {"fedavg": 1, "local": 6, "fedavg_ft": 1, "oracle": 2}[name]
    assert len(clusters) == expected
    if name == "oracle":
        assert summary["ari"] == 1.0


def test_fine_tuning_changes_the_final_models(tmp_path: Path) -> None:
    fedavg = run_experiment(validate(small_config()), tmp_path / "a", quiet=True)
    ft = run_experiment(validate(small_config(algorithm={"name": "fedavg_ft"})), tmp_path / "b",
                        quiet=True)
    # Identical until the end, then each client fine-tunes the global model.
    assert _metrics(tmp_path / "a")[-1]["accuracy"] == _metrics(tmp_path / "b")[-1]["accuracy"]
    assert ft["accuracy"]["per_client"] != fedavg["accuracy"]["per_client"]


def test_summary_has_the_design_fields(tmp_path: Path) -> None:
    summary = Run(validate(small_config()), tmp_path / "r", quiet=True).execute()
    for key in ("algorithm", "dataset", "scenario", "seed", "rounds", "num_clients", "clusters",
                "true_groups", "ari", "accuracy", "splits", "wall_seconds", "rounds_per_second"):
        assert key in summary
    assert set(summary["accuracy"]) == {"mean", "worst", "per_client"}
    timing = summary["timing"]
    assert 0 < timing["train_seconds"] < timing["round_seconds"] <= summary["wall_seconds"]
    assert 0 < timing["outside_training_share"] < 1
    assert np.isclose(summary["accuracy"]["mean"], np.mean(summary["accuracy"]["per_client"]),
                      atol=1e-5)


@pytest.mark.parametrize("algorithm", [{"name": "incremental", "cluster_round": 5},
                                       {"name": "ifca", "clusters": 2, "init": "clients"}],
                         ids=["incremental", "ifca"])
def test_assign_places_new_clients_without_a_tree_by_their_own_scores(
        tmp_path: Path, algorithm: dict) -> None:
    """No parameter tree: a new client joins the cluster model that scores best on its own
    training data (incremental: accuracy, IFCA: loss), as the method places clients."""
    out = tmp_path / "run"
    summary = run_experiment(validate(_split_config(rounds=14, algorithm=algorithm)), out,
                             quiet=True)
    assert summary["ari"] == 1.0 and summary["num_clusters"] == 2
    result = assign_new_clients(out, clients=6, seed=99)
    assert result["routed_correctly"] == 1.0 and result["algorithm"] == algorithm["name"]
    assert len(result["clients"]) == 6 and not any("route" in r for r in result["clients"])
    assert {r["cluster_group"] for r in result["clients"]} == {0, 1}


def test_assign_refuses_a_method_without_a_shared_model(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_experiment(validate(small_config(algorithm={"name": "local"})), out, quiet=True)
    with pytest.raises(FedflockError, match="no shared model"):
        assign_new_clients(out, clients=2, seed=1)


def test_assign_fine_tunes_a_new_client_where_the_method_does(tmp_path: Path) -> None:
    """fedavg_ft's clients end by fine-tuning the global model; a new client does too before it
    is scored (same global model as fedavg, so the scores differ by the fine-tuning alone)."""
    for name in ("fedavg", "fedavg_ft"):
        run_experiment(validate(small_config(algorithm={"name": name})), tmp_path / name,
                       quiet=True)
    plain = assign_new_clients(tmp_path / "fedavg", clients=4, seed=7)
    tuned = assign_new_clients(tmp_path / "fedavg_ft", clients=4, seed=7)
    assert (plain["finetune_epochs"], tuned["finetune_epochs"]) == (0, 3)
    assert tuned["metric"] == "accuracy"
    assert [r["accuracy"] for r in tuned["clients"]] != [r["accuracy"] for r in plain["clients"]]
