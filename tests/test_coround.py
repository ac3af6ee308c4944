"""Louvain inside a cluster on its members' same-round cosines (`clustering.coround`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedflock.clustering.coround import SameRoundCosines, louvain_split
from fedflock.experiment import run_experiment
from fedflock.report import make_report
from fedflock.validation import validate
from tests.conftest import make_algorithm, one_community, small_config, update_reply
from tests.test_algorithm_contract import _through_a_checkpoint_file
from tests.test_recheck import PARTIAL


def test_pairs_are_averaged_over_the_rounds_both_replied_in() -> None:
    cosines = SameRoundCosines()
    e0, e1 = torch.eye(3)[0], torch.eye(3)[1]
    cosines.add([5, 7], torch.stack([e0, e0]))  # cosine 1 (first half)
    cosines.add([7, 9], torch.stack([e0, e1]))  # cosine 0 (second half)
    cosines.add([5, 7, 9], torch.stack([e0, -e0, e1]))  # 5-7: -1, 5-9: 0, 7-9: 0 (first)
    cosines.add([9], e1[None])  # a lone reply meets nobody, and is no round of a half
    mean = cosines.mean()
    at = {c: i for i, c in enumerate(cosines.clients)}
    assert sorted(at) == [5, 7, 9]
    assert mean[at[5], at[7]] == mean[at[7], at[5]] == 0.0  # (1 + -1) / 2
    assert mean[at[5], at[9]] == 0.0 and cosines.count.sum(0)[at[5], at[9]] == 1
    assert cosines.count.sum(0)[at[7], at[9]] == 2
    assert np.isnan(mean).sum() == 3  # the diagonal only: every pair met
    first, second = cosines.mean(0), cosines.mean(1)
    assert first[at[5], at[7]] == 0.0 and second[at[7], at[9]] == 0.0
    assert np.isnan(second[at[5], at[7]]) and cosines.rounds == 3
    state = _through_a_checkpoint_file(cosines.state_dict())
    restored = SameRoundCosines.from_state(state)
    assert restored.clients == cosines.clients
    assert np.array_equal(restored.mean(), mean, equal_nan=True)
    before = state["total"].clone()
    restored.add([5, 7], torch.stack([e0, e0]))
    assert torch.equal(state["total"], before)  # the loaded checkpoint is not written into


def test_tests_are_due_as_the_judging_half_doubles_and_spend_halving_levels() -> None:
    cosines = SameRoundCosines()
    pair = torch.eye(2)
    assert cosines.look() is None  # nothing judged yet
    shares = []
    for _ in range(40):  # one pair a round, alternate rounds to the judging half
        cosines.add([0, 1], pair)
        share = cosines.look()
        if share is not None:
            shares.append((cosines.looked_at, share))
    assert shares == [(1.0, 0.5), (2.0, 0.25), (4.0, 0.125), (8.0, 0.0625), (16.0, 0.03125)]


def _replies(groups: list[int], directions: torch.Tensor, per_round: int, noise: float,
             gen: torch.Generator, rng: np.random.Generator) -> tuple[list[int], torch.Tensor]:
    """One round: `per_round` clients, each sending its group's direction plus noise."""
    clients = sorted(rng.choice(len(groups), per_round, replace=False).tolist())
    noisy = directions[[groups[c] for c in clients]] + noise * torch.randn(
        len(clients), directions.shape[1], generator=gen)
    return clients, noisy


def _rounds(groups: list[int], directions: torch.Tensor, rounds: int, per_round: int,
            noise: float, seed: int) -> SameRoundCosines:
    """The pair sums of `rounds` such rounds."""
    gen, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
    cosines = SameRoundCosines()
    for _ in range(rounds):
        cosines.add(*_replies(groups, directions, per_round, noise, gen, rng))
    return cosines


def test_two_groups_split_once_enough_pairs_have_met_and_not_before() -> None:
    groups = [0] * 10 + [1] * 10
    directions = torch.eye(200)[:2] + 0.3 * torch.eye(200)[2]  # a shared part, as in FL
    early = _rounds(groups, directions, rounds=4, per_round=3, noise=0.08, seed=0)
    assert louvain_split(early, max_ratio=0.25, level=1e-3, min_size=3) is None
    late = _rounds(groups, directions, rounds=100, per_round=3, noise=0.08, seed=0)
    found = louvain_split(late, max_ratio=0.25, level=1e-3, min_size=3)
    assert found is not None
    assert sorted(found.parts) == [list(range(10)), list(range(10, 20))]
    assert found.figures["apart_ratio"] < 0.25
    assert found.figures["pairs_seen"] <= found.figures["pairs"] == 190


@pytest.mark.parametrize("noise", [0.1, 1.0])
def test_a_cluster_without_groups_does_not_split_tested_whenever_due_for_300_rounds(
        noise: float) -> None:
    """One direction plus noise (0.1: pairs' cosines about 0.3; 1.0: about 0.005, noise
    alone), 3 replies a round, tested as the algorithm does: whenever a test is due, at its
    share of the level. Louvain finds communities in these; none is shown apart."""
    direction = torch.zeros(1, 200)
    direction[0, 0] = 1.0
    for seed in range(20):
        gen, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
        cosines = SameRoundCosines()
        for _ in range(300):
            cosines.add(*_replies([0] * 20, direction, 3, noise, gen, rng))
            share = cosines.look()
            if share is not None:
                assert louvain_split(cosines, 0.25, 1e-3 * share, 3) is None


def test_a_loose_level_splits_noise_which_the_default_does_not() -> None:
    """What the level guards against: at 0.49 the bounds are about the plain means."""
    direction = torch.zeros(1, 200)
    direction[0, 0] = 1.0
    splits = {level: sum(louvain_split(_rounds([0] * 20, direction, 20, 3, 1.0, seed),
                                       0.25, level, 3) is not None for seed in range(40))
              for level in (0.49, 1e-3)}
    assert splits[1e-3] == 0 and splits[0.49] > 0, splits


def _two_group_rounds(alg, rounds: range, per_round: int, seed: int) -> None:
    """Clients 0-9 send direction a, 10-19 direction b (plus noise), `per_round` a round."""
    gen, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
    directions = torch.eye(200)[:2] + 0.3 * torch.eye(200)[2]
    for rnd in rounds:
        clients, updates = _replies([0] * 10 + [1] * 10, directions, per_round, 0.08, gen, rng)
        alg.aggregate_train(rnd, [update_reply(c, 0.01 * u)
                                  for c, u in zip(clients, updates, strict=True)])


def test_incremental_reclusters_a_cluster_on_its_members_same_round_cosines() -> None:
    """Round 1 (every client, one common direction) leaves one community; afterwards the two
    groups' same-round updates point apart. With the split windows switched off
    (f_threshold out of reach), only recluster can split, and it does, into the groups, with
    its figures recorded; a checkpoint keeps the pair sums."""
    alg = make_algorithm("incremental", 20, 200, cluster_round=1, recluster=True,
                         f_threshold=1e9)
    common = torch.eye(200)[2]
    alg.aggregate_train(1, [update_reply(c, 0.01 * common) for c in range(20)])
    assert alg.clustered_round == 1 and alg.num_clusters() == 1
    _two_group_rounds(alg, range(2, 40), per_round=3, seed=0)
    state = _through_a_checkpoint_file(alg.state_dict())
    assert alg.coround and next(iter(state["coround"].values()))["rounds"] > 0
    resumed = make_algorithm("incremental", 20, 200, cluster_round=1, recluster=True,
                             f_threshold=1e9)
    resumed.load_state_dict(state)
    _two_group_rounds(alg, range(40, 200), per_round=3, seed=1)
    _two_group_rounds(resumed, range(40, 200), per_round=3, seed=1)
    assert [d.as_dict() for d in resumed.decisions] == [d.as_dict() for d in alg.decisions]
    decisions = [d for d in alg.decisions if d.figures.get("rule") == "recluster"]
    assert len(decisions) == 1 and alg.num_clusters() >= 2
    split = decisions[0]
    assert all(set(p) <= set(range(10)) or set(p) <= set(range(10, 20)) for p in split.members)
    assert split.figures["apart_ratio"] <= 0.25 and split.figures["pairs_seen"] > 0
    clusters = alg.clusters()
    assert all(set(c) <= set(range(10)) or set(c) <= set(range(10, 20)) for c in clusters)


def test_recluster_is_off_by_default_and_needs_recheck() -> None:
    with pytest.raises(ValueError, match="recluster needs recheck"):
        make_algorithm("incremental", 4, 8, recluster=True, recheck=False)
    alg = make_algorithm("incremental", 20, 200, cluster_round=1, f_threshold=1e9)
    alg.aggregate_train(1, [update_reply(c, 0.01 * torch.eye(200)[2]) for c in range(20)])
    _two_group_rounds(alg, range(2, 200), per_round=3, seed=0)
    assert alg.num_clusters() == 1 and not alg.coround


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_run_whose_first_clustering_found_nothing_is_reclustered_and_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Louvain's communities all merged back at the first clustering (forced here), and the
    split windows out of reach: recluster alone finds the four groups of a partial-
    participation run, and the report draws and names its decisions."""
    from fedflock.algorithms import incremental

    monkeypatch.setattr(incremental, "nested_communities", one_community)
    raw = small_config(**PARTIAL, algorithm={"name": "incremental", "recluster": True,
                                             "f_threshold": 1e9, "cluster_when": "settled"})
    summary = run_experiment(validate(raw), tmp_path / "run", quiet=True)
    splits = summary["splits"]
    assert splits and all(s["rule"] == "recluster" for s in splits)
    assert all(s["apart_ratio"] <= 0.25 for s in splits)
    assert summary["ari"] >= 0.95, summary["clusters"]
    assert make_report(tmp_path / "run")
    report = (tmp_path / "run" / "report" / "report.md").read_text()
    assert report.count("| re-examination (Louvain, same-round cosines) |") == len(splits)
