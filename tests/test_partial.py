"""Partial participation: the incremental similarity store, Louvain communities, the incremental
algorithm, CFL with absent clients, and clustering as a defence against model poisoning."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
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
    modularity,
    nested_communities,
    separated_share,
)
from fedflock.experiment import run_experiment, without_timings
from fedflock.similarity.incremental import IncrementalSimilarity
from fedflock.validation import validate
from tests.conftest import make_algorithm, small_config, update_reply

# -- the store ---------------------------------------------------------------------------------


def _direct(measure: str, a: torch.Tensor) -> torch.Tensor:
    a = a.double()
    if measure == "cosine":
        unit = a / a.norm(dim=1, keepdim=True)
        return unit @ unit.T
    return torch.cdist(a, a, p=2 if measure == "euclidean" else 1)


rounds = st.lists(st.sets(st.integers(0, 11), min_size=1, max_size=5), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(rounds, st.sampled_from(["cosine", "euclidean", "manhattan"]), st.integers(0, 2**31))
def test_store_equals_the_full_matrix_of_latest_updates(batches: list[set[int]], measure: str,
                                                        seed: int) -> None:
    """Filled incrementally, every known pair holds the value of the two clients' latest
    updates; never-sampled clients have no row."""
    gen = torch.Generator().manual_seed(seed)
    store = IncrementalSimilarity(measure)
    latest: dict[int, torch.Tensor] = {}
    for batch in batches:
        clients = sorted(batch)
        updates = torch.randn(len(clients), 7, generator=gen) + 0.1
        store.add(clients, updates)
        latest.update({c: u for c, u in zip(clients, updates, strict=True)})
    seen, values = store.values()
    assert sorted(seen) == sorted(latest)
    expected = _direct(measure, torch.stack([latest[c] for c in seen]))
    assert torch.allclose(values.double(), expected, atol=1e-4, rtol=1e-4)


def test_store_work_per_round_is_new_times_stored() -> None:
    """A round compares the k new updates with the n stored ones only: an (k, n) block."""
    calls = []
    store = IncrementalSimilarity("cosine")
    original = store.measure
    store.measure = lambda new, old, a, b: calls.append((len(new), len(old))) or original(
        new, old, a, b)
    store.add(list(range(50)), torch.randn(50, 4))
    store.add([3, 60], torch.randn(2, 4))
    assert calls == [(50, 50), (2, 51)]
    assert len(store) == 51 and store.state_dict()["matrix"].shape == (51, 51)


@pytest.mark.parametrize("measure", ["cosine", "euclidean"])
def test_a_sketched_store_keeps_the_values_within_the_sketch_error(measure: str) -> None:
    gen = torch.Generator().manual_seed(0)
    dim, m, n = 20_000, 2048, 60
    centres = torch.randn(3, dim, generator=gen)
    updates = torch.stack([centres[i % 3] + torch.randn(dim, generator=gen) for i in range(n)])
    exact = IncrementalSimilarity(measure)
    sketched = IncrementalSimilarity(measure, sketch=m, sketch_seed=7)
    for lo in range(0, n, 20):  # filled over rounds, as in a run
        exact.add(list(range(lo, lo + 20)), updates[lo : lo + 20])
        sketched.add(list(range(lo, lo + 20)), updates[lo : lo + 20])
    truth, approx = exact.values()[1].double(), sketched.values()[1].double()
    scale = 1.0 if measure == "cosine" else float(truth.max())
    error = (truth - approx).abs() / scale
    assert float(error.max()) < 5 * (2 / m) ** 0.5  # five standard errors of a cosine
    assert float(error.max()) > 0  # a real sketch, not the updates themselves
    assert sketched.state_dict()["updates"].shape == (n, m)
    again = IncrementalSimilarity(measure, sketch=m, sketch_seed=7)
    again.add(list(range(n)), updates)
    assert torch.equal(again.values()[1], sketched.values()[1])  # seeded: the same map
    restored = IncrementalSimilarity.from_state(sketched.state_dict())
    restored.add([0], updates[:1])
    assert torch.allclose(restored.values()[1], sketched.values()[1], atol=1e-5)


def test_manhattan_refuses_a_sketch() -> None:
    with pytest.raises(ValueError, match="inner products"):
        IncrementalSimilarity("manhattan", sketch=64)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_sketched_incremental_run_finds_the_same_partition(tmp_path: Path) -> None:
    exact = _run(tmp_path, "exact", algorithm={"name": "incremental", "sketch": None})
    sketched = _run(tmp_path, "sketch", algorithm={"name": "incremental", "sketch": 512})
    assert exact["ari"] == 1.0
    assert sorted(map(sorted, sketched["clusters"])) == sorted(map(sorted, exact["clusters"]))


# -- communities -------------------------------------------------------------------------------


def _blocks(sizes: list[int], inside: float, across: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    sim = np.where(labels[:, None] == labels[None, :], inside, across)
    sim = sim + rng.normal(0, 0.05, sim.shape)
    return (sim + sim.T) / 2, labels


@pytest.mark.parametrize("backend", ["igraph", "networkx"])
def test_louvain_finds_blocks_and_reports_modularity(backend: str) -> None:
    sim, labels = _blocks([10, 7, 5], inside=0.6, across=-0.2)
    found = louvain(affinity(sim, True), backend=backend)
    assert sorted(map(sorted, found.parts)) == sorted(
        np.flatnonzero(labels == g).tolist() for g in range(3))
    weights = affinity(sim, True)
    graph = nx.from_numpy_array(weights)
    assert found.modularity == pytest.approx(
        nx.community.modularity(graph, [set(p) for p in found.parts], weight="weight"))
    assert found.modularity == pytest.approx(modularity(weights, found.parts))
    assert found.cross_ratio < 0.05  # the blocks share (almost) no weight


def test_a_uniform_cloud_is_cut_by_louvain_but_flagged_by_the_cross_ratio() -> None:
    sim, _ = _blocks([40], inside=0.04, across=0.04, seed=4)  # like converged IID updates
    found = louvain(affinity(sim, True))
    assert len(found.parts) > 1  # Louvain always finds something
    assert found.cross_ratio > 0.5


def test_merge_close_rejoins_a_cut_cloud_and_keeps_isolated_clients_apart() -> None:
    sim, _ = _blocks([40], inside=0.04, across=0.04, seed=4)
    weights = affinity(sim, True)
    assert len(louvain(weights).parts) > 1
    assert merge_close(weights, louvain(weights).parts, 0.25) == [list(range(40))]
    # add 5 clients with zero updates (no edge to anyone): they stay singletons
    padded = np.zeros((45, 45))
    padded[:40, :40] = weights
    parts = merge_close(padded, louvain(padded).parts, 0.25)
    assert parts[0] == list(range(40)) and sorted(parts[1:]) == [[i] for i in range(40, 45)]
    blocks, _ = _blocks([10, 7, 5], inside=0.6, across=-0.2)
    found = louvain(affinity(blocks, True)).parts
    assert merge_close(affinity(blocks, True), found, 0.25) == found


def _paired_blocks(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """8 groups of 5 in 4 pairs: cosine 0.65 within a group, 0.12 to its pair, -0.2 else."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(8), 5)
    pair = labels[:, None] // 2 == labels[None, :] // 2
    sim = np.where(labels[:, None] == labels[None, :], 0.65, np.where(pair, 0.12, -0.2))
    sim = sim + rng.normal(0, 0.05, sim.shape)
    return (sim + sim.T) / 2, labels


@pytest.mark.parametrize("seed", [0, 1])
def test_nested_communities_part_the_small_groups_that_modularity_lumps_in_pairs(
        seed: int) -> None:
    sim, labels = _paired_blocks(seed)
    weights = affinity(sim, True)
    truth = sorted(np.flatnonzero(labels == g).tolist() for g in range(8))
    pairs = sorted(np.flatnonzero(labels // 2 == g).tolist() for g in range(4))
    means = lambda parts: block_means(weights, parts)  # noqa: E731
    # resolution limit: at resolution 1 each pair is one community, and merge_close keeps them
    assert sorted(merge_close(means, louvain(weights).parts, 0.25)) == pairs
    found = nested_communities(weights, means, 0.25)
    assert sorted(map(sorted, found.first.parts)) == pairs and sorted(found.merged) == pairs
    assert sorted(found.parts) == truth and [len(p) for p in found.parts] == [5] * 8


def test_separated_share_counts_the_pairs_a_cut_sets_apart_among_those_it_holds() -> None:
    cuts = [[[1, 2], [3, 4]], [[1, 3], [2, 9]]]
    assert separated_share(cuts, [1, 2], [3, 4]) == pytest.approx((4 + 1) / (4 + 2))
    assert separated_share(cuts, [1], [2]) == pytest.approx(1 / 2)
    assert separated_share(cuts, [1, 2], [5, 6]) is None  # no cut holds 5 or 6


def test_separated_share_ignores_members_alone_in_their_part() -> None:
    """A block of identical updates (colluding attackers) with every other update alone: the
    cut is no evidence that any two of the others belong apart."""
    attack = [[0, 1, 2, 3], [4], [5], [6], [7], [8], [9]]
    assert separated_share([attack], [4, 5], [6, 7]) is None
    assert separated_share([attack], [0, 1], [4, 5]) is None  # 4 and 5 alone: not counted
    mixed = [[0, 1], [2, 3], [4]]
    assert separated_share([mixed], [0, 4], [1]) == pytest.approx(0.0)  # only (0, 1) counts


def test_nested_communities_take_the_callers_evidence_over_the_ratio_test() -> None:
    sim, labels = _paired_blocks(0)
    sim = np.where((labels[:, None] // 2 == labels[None, :] // 2) & (
        labels[:, None] != labels[None, :]), 0.3, sim)  # pairs closer: ratio 0.46, lumped
    weights = affinity(sim, True)
    means = lambda parts: block_means(weights, parts)  # noqa: E731
    truth = sorted(np.flatnonzero(labels == g).tolist() for g in range(8))
    pairs = sorted(np.flatnonzero(labels // 2 == g).tolist() for g in range(4))
    assert sorted(nested_communities(weights, means, 0.25).parts) == pairs
    by_group = lambda a, b: set(labels[a]).isdisjoint(labels[b])  # noqa: E731
    assert sorted(nested_communities(weights, means, 0.25, apart=by_group).parts) == truth
    silent = lambda a, b: None  # noqa: E731  (no evidence: the ratio test decides)
    assert sorted(nested_communities(weights, means, 0.25, apart=silent).parts) == pairs


def test_nested_communities_leave_a_uniform_cloud_whole_and_stop_at_tight_groups() -> None:
    sim, _ = _blocks([40], inside=0.04, across=0.04, seed=4)
    weights = affinity(sim, True)
    means = lambda parts: block_means(weights, parts)  # noqa: E731
    assert nested_communities(weights, means, 0.25).parts == [list(range(40))]
    blocks, labels = _blocks([10, 7, 5], inside=0.6, across=-0.2)
    weights = affinity(blocks, True)
    parts = nested_communities(weights, lambda p: block_means(weights, p), 0.25).parts
    assert parts == [np.flatnonzero(labels == g).tolist() for g in range(3)]


def test_a_graph_without_edges_is_one_community() -> None:
    found = louvain(affinity(-np.ones((4, 4)), True))
    assert found.parts == [[0, 1, 2, 3]] and found.cross_ratio == 1.0


def test_affinity_of_distances_is_scale_free_and_unknown_pairs_have_no_edge() -> None:
    d = np.array([[0, 1, 4], [1, 0, np.nan], [4, np.nan, 0]], dtype=float)
    w = affinity(d, is_similarity=False)
    assert np.allclose(w, affinity(10 * d, is_similarity=False))
    assert w[1, 2] == 0 and w[0, 1] > w[0, 2] > 0 and (np.diag(w) == 0).all()


# -- algorithms under partial participation ---------------------------------------------------

PARTIAL = {"data.clients": 40, "data.scenario.groups": 4, "rounds": 40,
           "data.samples_per_client": 60, "participation.fraction": 0.25,
           "training.local_epochs": 2, "model.hidden": [64], "checkpoint_every": 10}


def _run(tmp_path: Path, name: str, **extra: object) -> dict:
    raw = small_config(**{**PARTIAL, **extra})
    return run_experiment(validate(raw), tmp_path / name, quiet=True)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_incremental_finds_the_groups_with_fedavg_communication(tmp_path: Path) -> None:
    summary = _run(tmp_path, "inc", algorithm={"name": "incremental"})
    fedavg = _run(tmp_path, "avg", algorithm={"name": "fedavg"})
    assert summary["ari"] == 1.0 and summary["num_clusters"] == 4
    assert summary["accuracy"]["mean"] > fedavg["accuracy"]["mean"] + 0.3
    assert sorted(c for part in summary["clusters"] for c in part) == list(range(40))
    # every client seen before clustering: not one float more than FedAvg, either way
    seen_all = _run(tmp_path, "inc-all", algorithm={"name": "incremental", "min_coverage": 1.0})
    assert seen_all["ari"] == 1.0
    assert seen_all["communication"] == fedavg["communication"]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_incremental_keeps_iid_clients_together(tmp_path: Path) -> None:
    summary = _run(tmp_path, "iid", algorithm={"name": "incremental"},
                   **{"data.scenario.kind": "iid", "data.scenario.groups": 1})
    assert summary["num_clusters"] == 1


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_incremental_resume_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    whole = _run(tmp_path, "whole", algorithm={"name": "incremental"})
    cut = validate(small_config(**{**PARTIAL, "rounds": 12, "algorithm": {"name": "incremental"}}))
    run_experiment(cut, tmp_path / "cut", quiet=True)  # stops right after clustering
    (tmp_path / "cut" / "config.yaml").write_text(
        (tmp_path / "whole" / "config.yaml").read_text())
    resumed = run_experiment(validate(small_config(**{**PARTIAL,
                                                      "algorithm": {"name": "incremental"}})),
                             tmp_path / "cut", resume=True, quiet=True)
    assert without_timings(resumed) == without_timings(whole)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_cfl_splits_under_partial_participation_and_places_everyone(tmp_path: Path) -> None:
    summary = _run(tmp_path, "cfl", algorithm={"name": "cfl"})
    assert summary["ari"] == 1.0
    assert sorted(c for part in summary["clusters"] for c in part) == list(range(40))
    # the first split used only the members in its window, not the absent ones
    first = summary["splits"][0]
    assert sum(first["sizes"]) < 40


def _reply(client: int, direction: torch.Tensor):
    return update_reply(client, direction)


def test_cfl_never_gives_absent_clients_a_row_and_routes_them_by_the_tree() -> None:
    cfl = make_algorithm("cfl", 8, 4, warmup_rounds=0, patience=1, min_replies=4)
    a, b = torch.tensor([1.0, 0, 0, 0]), torch.tensor([0, 1.0, 0, 0])
    gen = torch.Generator().manual_seed(0)
    noisy = [(v + 0.01 * torch.randn(4, generator=gen)) for v in (a, a, a, b, b, b)]
    replies = [_reply(c, u) for c, u in zip([0, 1, 2, 4, 5, 6], noisy, strict=True)]
    cfl.aggregate_train(1, replies)  # clients 3 and 7 absent
    assert len(cfl.decisions) == 1
    assert sorted(map(sorted, cfl.decisions[0].members)) == [[0, 1, 2], [4, 5, 6]]
    assert cfl.unplaced() == [3, 7]
    assert cfl.num_clusters() == 2 and len(cfl.clusters()) == 3  # the waiting form no cluster
    # absent clients wait with the model the cluster had when it split
    assert torch.equal(cfl.model_of(3), torch.zeros(4))
    tasks = cfl.configure_train(2, [3, 7])
    assert all(torch.equal(t.params, torch.zeros(4)) for t in tasks)
    cfl.aggregate_train(2, [_reply(3, b), _reply(7, a)])
    assert cfl.unplaced() == []
    clusters = sorted(map(sorted, cfl.clusters()))
    assert clusters == [[0, 1, 2, 7], [3, 4, 5, 6]]


def test_cfl_gathers_a_window_over_rounds_once_its_model_has_settled() -> None:
    cfl = make_algorithm("cfl", 10, 3, warmup_rounds=0, patience=2, min_replies=4,
                         window_coverage=0.1)
    a, b = torch.tensor([1.0, 0, 0]), torch.tensor([0, 1.0, 0])
    root = cfl._clusters[0].id
    cfl.aggregate_train(1, [_reply(0, a), _reply(1, a), _reply(5, b), _reply(6, b)])
    watch = cfl.watches[root]
    assert len(watch.scores) == 1  # four replied: a window of one round
    cfl.aggregate_train(2, [_reply(0, a), _reply(5, b)])  # too few, and the model unsettled:
    assert len(watch.scores) == 1 and len(watch.window) == 0  # the window is dropped
    watch.stability.changes = [0.01] * 4  # settled: a window may now span rounds
    cfl.aggregate_train(3, [_reply(0, a), _reply(5, b)])
    assert len(watch.scores) == 1 and len(watch.window) == 2 and not cfl.decisions
    cfl.aggregate_train(4, [_reply(2, a), _reply(7, b)])  # four members over two rounds
    assert len(cfl.decisions) == 1
    assert sorted(map(sorted, cfl.decisions[0].members)) == [[0, 2], [5, 7]]
    assert cfl.unplaced() == [1, 3, 4, 6, 8, 9]  # not in the deciding window: routed later


# -- clustering as a defence -------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_incremental_isolates_a_colluding_majority(tmp_path: Path) -> None:
    iid = {"data.scenario.kind": "iid", "data.scenario.groups": 1,
           "attack": {"kind": "sign_flip", "fraction": 0.6, "colluding": True}}
    defended = _run(tmp_path, "inc", algorithm={"name": "incremental", "min_coverage": 1.0,
                                                "restart": "initial"}, **iid)
    median = _run(tmp_path, "median", algorithm={"name": "median"}, **iid)
    attack = defended["attack"]
    assert len(attack["malicious"]) == 24
    benign = attack["benign_cluster"]
    assert benign["malicious"] == 0 and benign["size"] == 16
    assert attack["benign_accuracy"] > 0.75
    assert median["attack"]["benign_accuracy"] < 0.3


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_label_flipping_reports_its_success_rate(tmp_path: Path) -> None:
    flip = {"data.scenario.kind": "iid", "data.scenario.groups": 1, "rounds": 15,
            "participation.fraction": 1.0, "attack": {"kind": "label_flip", "fraction": 0.7}}
    attacked = _run(tmp_path, "flip", algorithm={"name": "fedavg"}, **flip)
    asr = attacked["attack"]["attack_success_rate"]
    assert asr > 0.5  # a 70% majority teaches the shared model its labels
    clean = _run(tmp_path, "clean", algorithm={"name": "fedavg"},
                 **{**flip, "attack": {"kind": "label_flip", "fraction": 0.05}})
    assert clean["attack"]["attack_success_rate"] < 0.2
