"""Clustering that corrects itself: the stabilisation test, the windowed split test that keeps
examining a cluster, and incremental clustering repairing an under-split with it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from fedflock.clustering.stability import Stabilisation
from fedflock.clustering.watch import SplitWatch
from fedflock.data.scenarios import build_federated_data
from fedflock.experiment import run_experiment
from fedflock.report import make_report
from fedflock.validation import validate
from tests.conftest import (
    groups_and_outliers,
    make_algorithm,
    one_community,
    small_config,
    update_reply,
)


def _verdicts(changes: list[float], scale: float) -> list[bool]:
    stability = Stabilisation(patience=3, tol=0.1)
    out = []
    for change in changes:
        before = torch.full((4,), scale)
        stability.add(before, before * (1 + change))
        out.append(stability.stable())
    return out


def test_stabilisation_waits_until_the_change_stops_shrinking_whatever_the_scale() -> None:
    shrinking = [0.5 * 0.8**t for t in range(12)]
    settled = shrinking + [shrinking[-1]] * 6
    assert not any(_verdicts(shrinking, 1.0))
    assert _verdicts(settled, 1.0)[-1]
    assert _verdicts(settled, 1e-3) == _verdicts(settled, 1.0) == _verdicts(settled, 1e3)


MODEL = torch.ones(5)


def _settled_watch(patience: int = 2) -> SplitWatch:
    watch = SplitWatch(Stabilisation(patience, 0.1), coverage=0.5, min_size=3)
    watch.stability.changes = [0.01] * (2 * patience)
    watch.stability.last = MODEL  # observing the same model again adds no change
    return watch


def _updates(directions: list[torch.Tensor], gen: torch.Generator) -> torch.Tensor:
    return torch.stack([d + 0.05 * torch.randn(len(d), generator=gen) for d in directions])


def test_a_watch_splits_two_groups_from_windows_of_same_period_updates() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.zeros(50), torch.zeros(50)
    a[0], b[1] = 1.0, 1.0
    members = list(range(8))  # 0-3 send a, 4-7 send b
    watch = _settled_watch(patience=2)
    found = []
    for rnd in range(6):  # two members a round: a window of 4 closes every other round
        clients = [(2 * rnd) % 4, 4 + (2 * rnd + 1) % 4]
        exam = watch.examine(members, MODEL, clients, _updates([a, b], gen), [10, 10])
        found.append(exam)
    exams = [e for e in found if e is not None]
    assert [e is None for e in found] == [True, False, True, False, True, False]
    assert all(len(e.window.clients) == 4 for e in exams)  # a window holds only its own updates
    verdicts = [watch.fires(e.stats.pseudo_f, 3.5) for e in exams]
    assert verdicts == [False, True, True]  # patience 2: two windows in a row
    held = exams[1].window.clients
    parts = sorted(sorted(held[i] for i in part) for part in exams[1].stats.parts)
    assert all(set(p) <= {0, 1, 2, 3} or set(p) <= {4, 5, 6, 7} for p in parts)


def test_a_window_mixing_eight_groups_fires_on_the_best_cut_not_on_the_bipartition() -> None:
    """16 updates of 8 groups a round: the bipartition's pseudo-F stays below the threshold
    (its noise-free ceiling is 14 / 6), the best cut of the merge tree does not; the split
    keeps every group whole, in two parts or in the cut's eight."""
    gen = torch.Generator().manual_seed(2)
    directions = list(torch.eye(50)[:8])
    members = list(range(16))  # client c sends direction c // 2
    watch = _settled_watch(patience=2)
    exams = [watch.examine(members, MODEL, members, _updates(
        [directions[c // 2] for c in members], gen), [10] * 16) for _ in range(2)]
    assert all(e is not None and e.stats.pseudo_f < 3.5 for e in exams)
    assert [watch.fires(e.stats.score("kway"), 3.5) for e in exams] == [False, True]
    stats = exams[-1].stats
    assert stats.kway_k == 8 and stats.kway_f > 3.5
    cut = stats.split("kway", "cut")
    assert sorted(cut) == [[2 * g, 2 * g + 1] for g in range(8)]
    two = stats.split("kway", "two")
    assert len(two) == 2 and all(all(c ^ 1 in part for c in part) for part in two)
    assert stats.split("bipartition", "cut") == two  # the bipartition statistic cuts in two


def test_a_watch_never_splits_a_cluster_without_structure_nor_spans_rounds_unsettled() -> None:
    gen = torch.Generator().manual_seed(1)
    common = torch.zeros(50)
    common[0] = 1.0
    members = list(range(8))
    watch = _settled_watch(patience=2)
    for rnd in range(40):
        clients = [(2 * rnd) % 8, (2 * rnd + 1) % 8]
        exam = watch.examine(members, MODEL, clients, _updates([common, common], gen), [10, 10])
        assert exam is None or not watch.fires(exam.stats.kway_f, 3.5)
        assert exam is None or exam.stats.kway_f >= exam.stats.pseudo_f * (1 - 1e-9)
    assert len(watch.scores) == 20 and max(watch.scores) < 3.5
    unsettled = SplitWatch(Stabilisation(2, 0.1), 0.5, 3)
    unsettled.stability.changes = [0.4, 0.3, 0.2, 0.1]  # still shrinking
    unsettled.stability.last = MODEL
    exam = unsettled.examine(members, MODEL, [0, 4], _updates([common, common], gen), [1, 1])
    assert exam is None and len(unsettled.window) == 0  # too few for one round: dropped
    whole = unsettled.examine(members, MODEL, [0, 1, 2, 3, 4], _updates([common] * 5, gen),
                              [1] * 5)
    assert whole is not None  # a window of one round needs no settled model


def test_same_round_share_lets_one_rounds_replies_be_a_window_before_the_model_settles(
        ) -> None:
    gen = torch.Generator().manual_seed(2)
    common = torch.zeros(50)
    common[0] = 1.0
    members = list(range(40))  # a window needs 20 updates (coverage 0.5)
    for share, closes in ((None, False), (0.5, True), (0.7, False)):
        watch = SplitWatch(Stabilisation(2, 0.1), 0.5, 3, share)
        watch.stability.changes = [0.4, 0.3, 0.2, 0.1]  # still shrinking: may not span
        watch.stability.last = MODEL
        exam = watch.examine(members, MODEL, list(range(12)), _updates([common] * 12, gen),
                             [1] * 12)  # 12 replies: at least half of 20, less than 0.7 of it
        assert (exam is not None) == closes and len(watch.window) == 0
        if closes:
            assert exam.window.clients == list(range(12))


def test_rounds_with_a_single_reply_neither_add_to_nor_drop_a_window() -> None:
    """One reply a round: the cluster model is the last client's, so the next update says
    how two clients differ, not how one does; such rounds leave the window as it is."""
    gen = torch.Generator().manual_seed(4)
    a, b = torch.zeros(50), torch.zeros(50)
    a[0], b[1] = 1.0, 1.0
    members = list(range(8))
    watch = _settled_watch()
    for client in range(8):  # one reply a round, for long enough to fill several windows
        direction = a if client < 4 else b
        assert watch.examine(members, MODEL, [client], _updates([direction], gen), [10]) is None
    assert len(watch.window) == 0
    assert watch.examine(members, MODEL, [0, 4], _updates([a, b], gen), [10, 10]) is None
    changes = len(watch.stability.changes)
    assert watch.examine(members, MODEL * 1.01, [1], _updates([a], gen), [10]) is None
    assert len(watch.stability.changes) == changes + 1  # the model's settling still tracked
    assert sorted(watch.window.updates) == [0, 4]  # the open window kept, nothing added
    exam = watch.examine(members, MODEL, [2, 5], _updates([a, b], gen), [10, 10])
    assert exam is not None and exam.window.clients == [0, 2, 4, 5]


def test_an_open_window_keeps_its_own_copies_not_views_of_the_rounds_replies() -> None:
    """A window that outlives its round must not hold views of the round's stacked replies:
    they would keep (and a checkpoint would save) every row of the stack."""
    gen = torch.Generator().manual_seed(5)
    a = torch.zeros(50)
    a[0] = 1.0
    watch = _settled_watch()
    stacked = _updates([a, a, a], gen)
    assert watch.examine(list(range(8)), MODEL, [0, 1, 2], stacked, [10, 10, 10]) is None
    for update in watch.window.updates.values():
        assert update.untyped_storage().data_ptr() != stacked.untyped_storage().data_ptr()
        assert update.untyped_storage().nbytes() == update.numel() * update.element_size()


PARTIAL = {"data.clients": 40, "data.scenario.groups": 4, "rounds": 60,
           "data.samples_per_client": 60, "participation.fraction": 0.25,
           "training.local_epochs": 2, "model.hidden": [64], "checkpoint_every": 20}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_incremental_repairs_an_under_split_by_later_splits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedflock.algorithms import incremental

    # the first clustering forced to find one community (the windows' evidence would part it)
    monkeypatch.setattr(incremental, "nested_communities", one_community)
    raw = small_config(**PARTIAL, algorithm={"name": "incremental"})
    summary = run_experiment(validate(raw), tmp_path / "run", quiet=True)
    splits = summary["splits"]  # Louvain's communities were merged into one: no split there
    assert splits and all(s["rule"] == "recheck" for s in splits)
    assert all(s["kway_f"] > 3.5 for s in splits)  # the statistic the default decides by
    assert all(len(s["children"]) == s["kway_k"] for s in splits)  # split into the cut
    assert summary["ari"] == 1.0 and summary["num_clusters"] == 4
    for split in splits:  # each part's members recorded, as a report draws them
        assert [len(part) for part in split["members"]] == split["sizes"]
        assert sum(split["sizes"]) == split["examined"] <= split["cluster_size"]
    assert make_report(tmp_path / "run")  # the similarity at each split, in its parts
    report = (tmp_path / "run" / "report" / "report.md").read_text()
    assert report.count("| re-examination (split test) |") == len(splits)
    tree = {node["id"]: node for node in summary["tree"]}  # the splits, as a cluster tree
    leaves = sorted(node["members"] for node in tree.values() if not node["children"])
    assert leaves == sorted(sorted(c) for c in summary["clusters"])
    root = next(node for node in tree.values() if node["parent"] is None)
    assert root["members"] == list(range(PARTIAL["data.clients"]))  # every client placed
    assert sorted((n["id"], n["split_round"], n["children"]) for n in tree.values()
                  if n["children"]) == sorted((s["parent"], s["round"], s["children"])
                                              for s in splits)
    assert (tmp_path / "run" / "report" / "tree.png").exists()


@pytest.mark.parametrize(("scores", "votes", "verdicts"), [
    ([5, 5, 5], None, [False, False, True]),  # default: `patience` (3) windows in a row
    ([5, 1, 5, 5], None, [False, False, False, False]),
    ([5, 1, 5], 2, [False, False, True]),  # 2 of the last 3, the latest among them
    ([5, 5], 2, [False, True]),
    ([5, 5, 1], 2, [False, True, False]),  # a window below never splits: its cut is noise
    ([5, 1, 1, 5], 2, [False, False, False, False]),  # the first 5 fell out of the last 3
])
def test_a_split_needs_votes_of_the_last_patience_windows(scores: list[float], votes: int | None,
                                                          verdicts: list[bool]) -> None:
    watch = _settled_watch(patience=3)
    assert [watch.fires(s, 3.5, votes) for s in scores] == verdicts


def test_votes_above_patience_is_a_config_error() -> None:
    from fedflock.errors import ConfigError

    raw = small_config(algorithm={"name": "cfl", "patience": 2, "votes": 3})
    with pytest.raises(ConfigError, match="votes"):
        validate(raw)


def _probe_round(gen: torch.Generator, probe_direction: torch.Tensor,
                 own_direction: torch.Tensor, n: int = 4) -> tuple[dict, dict]:
    probes = dict(enumerate(_updates([probe_direction] * n, gen)))
    own = dict(zip(range(100, 100 + n), _updates([own_direction] * n, gen), strict=True))
    return probes, own


def test_a_merge_needs_both_models_to_see_one_group_and_two_groups_are_settled_apart() -> None:
    from fedflock.clustering.merge import MergeTests

    gen = torch.Generator().manual_seed(5)
    a, b = torch.zeros(50), torch.zeros(50)
    a[0], b[1] = 1.0, 1.0
    same = MergeTests(patience=2, threshold=3.5, min_side=4)
    assert same.add(1, 2, *_probe_round(gen, a, a), needed=4) < 3.5  # one group: about 1
    assert same.verdict(1, 2) is None  # one window, one direction
    same.add(1, 2, *_probe_round(gen, a, a), needed=4)
    assert same.verdict(1, 2) is None  # two windows, but both at cluster 2's model
    same.add(2, 1, *_probe_round(gen, a, a), needed=4)
    assert same.verdict(1, 2) == "merge" and set(same.last(1, 2)) == {1, 2}
    apart = MergeTests(patience=2, threshold=3.5, min_side=4)
    for prober, host in ((1, 2), (2, 1)):
        assert apart.add(prober, host, *_probe_round(gen, a, b), needed=4) > 3.5
    assert apart.verdict(1, 2) == "apart" and frozenset((1, 2)) in apart.apart
    resumed = MergeTests(patience=2, threshold=3.5, min_side=4)
    resumed.load_state_dict(same.state_dict())
    assert resumed.verdict(2, 1) == "merge"
    assert same.needed(2, 40) is None and same.needed(5, 40) == 4 and same.needed(3, 3) == 3
    half = dict(list(_probe_round(gen, a, a)[0].items())[:2])
    assert same.add(3, 4, half, {}, needed=4) is None  # a window waits for enough of each side
    single = MergeTests(patience=1, threshold=3.5, min_side=4)  # still both directions
    single.add(1, 2, *_probe_round(gen, a, a), needed=4)
    assert single.verdict(1, 2) is None
    single.add(2, 1, *_probe_round(gen, a, a), needed=4)
    assert single.verdict(1, 2) == "merge"
    undecided = MergeTests(patience=2, threshold=3.5, min_side=4)
    for _ in range(6):  # one direction only, one group: never a merge; after 3 x 2, left apart
        assert undecided.verdict(1, 2) is None
        undecided.add(1, 2, *_probe_round(gen, a, a), needed=4)
    assert undecided.verdict(1, 2) == "apart"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_merge_test_undoes_an_over_split(tmp_path: Path) -> None:
    """Louvain at a high resolution, never merged back, cuts 2 groups into 6 communities; the
    merge test puts them back together and keeps the two groups apart."""
    over = {**PARTIAL, "data.scenario.groups": 2, "rounds": 80, "participation.fraction": 1.0}
    found = {}
    for merge in (False, True):
        raw = small_config(**over, algorithm={"name": "incremental", "resolution": 2.0,
                                              "max_cross_ratio": 1.0, "merge_test": merge})
        found[merge] = run_experiment(validate(raw), tmp_path / str(merge), quiet=True)
    assert found[False]["num_clusters"] > 2 and found[False]["ari"] < 0.5
    assert found[True]["num_clusters"] == 2 and found[True]["ari"] == 1.0
    merges = [d for d in found[True]["splits"] if d["kind"] == "merge"]
    assert merges and all(max(v for k, v in d.items() if k.startswith("score_at_")) <= 3.5
                          for d in merges)
    tree = {node["id"]: node for node in found[True]["tree"]}  # absorbed: empty, marked
    absorbed = [n for n in tree.values() if "merged_into" in n]
    assert len(absorbed) == len(merges) and all(not n["members"] for n in absorbed)
    assert make_report(tmp_path / "True")
    assert "| merge |" in (tmp_path / "True" / "report" / "report.md").read_text()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_probes_change_nothing_until_a_merge(tmp_path: Path) -> None:
    """Probes are side tasks: members train the partner's model besides their own, so a run
    whose pairs are found apart is the run without the test, at the price of more traffic."""
    apart = {**PARTIAL, "data.scenario.groups": 2, "rounds": 30}
    found = {}
    for merge in (False, True):
        raw = small_config(**apart, algorithm={"name": "incremental", "merge_test": merge,
                                               "stable_tol": 0.5})  # settles, so is probed
        found[merge] = run_experiment(validate(raw), tmp_path / str(merge), quiet=True)
    rounds = [json.loads(line) for line in (tmp_path / "True" / "metrics.jsonl").open()]
    scores = [s["score"] for r in rounds for s in r.get("algorithm", r).get("merge_test", [])]
    assert scores and min(scores) > 3.5  # pairs were probed, and found apart
    assert not [d for d in found[True]["splits"] if d["kind"] == "merge"]
    assert found[True]["accuracy"] == found[False]["accuracy"]
    assert found[True]["clusters"] == found[False]["clusters"]
    up = [found[m]["communication"]["up_floats"] for m in (False, True)]
    assert up[1] > up[0]  # the probes travelled


# CFL over-splitting 2 groups of 12: the paper's eps rule with thresholds that always fire,
# complete linkage, up to 4 clusters; every cluster tested as soon as its model settles.
CFL_OVER_SPLIT = {"data.clients": 24, "data.samples_per_client": 60,
                  "algorithm": {"name": "cfl", "split_rule": "eps", "eps1": 1e9, "eps2": 1e-9,
                                "gamma_check": False, "linkage": "complete",
                                "warmup_rounds": 3, "patience": 1, "max_clusters": 4,
                                "merge_test": True, "merge_min_probes": 3}}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_cfl_merges_parts_of_one_group_and_routes_new_clients_through_merged_leaves(
        tmp_path: Path) -> None:
    """The paper's eps rule with thresholds that always fire, complete linkage and up to 4
    clusters cuts each of 2 groups in two; the merge test puts the halves back together
    (the rule then cuts them again: merges and splits alternate), never joins the two groups,
    and `fedflock assign` routes new clients through leaves a merge absorbed."""
    from fedflock.assign import assign_new_clients

    config = validate(small_config(**CFL_OVER_SPLIT, rounds=16))
    summary = run_experiment(config, tmp_path / "run", quiet=True)
    groups = build_federated_data(config.data, config.seed).groups
    merges = [d for d in summary["splits"] if d["kind"] == "merge"]
    assert merges and all(max(d["score_at_kept"], d["score_at_absorbed"]) <= 3.5
                          for d in merges)
    assert all(len({groups[c] for c in d["members"][0]}) == 1 for d in merges)
    members = sorted(c for part in summary["clusters"] for c in part)
    assert members == list(range(24))
    tree = {node["id"]: node for node in summary["tree"]}
    assert {n["merged_into"] for n in tree.values() if "merged_into" in n} <= tree.keys()
    routed = assign_new_clients(tmp_path / "run", 6, seed=5)
    assert routed["routed_correctly"] >= 5 / 6
    assert any("merged_into" in step for c in routed["clients"] for step in c["path"])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_run_resumed_in_the_middle_of_merge_tests_merges_as_the_uninterrupted_one() -> None:
    from fedflock.algorithms.merging import MergingAlgorithm
    from tests.test_algorithm_contract import EmbeddedEngine, _play, build_algorithm

    half = {"participation.fraction": 0.5}  # so that a probe window spans rounds
    config = validate(small_config(**CFL_OVER_SPLIT, **half))
    engine = EmbeddedEngine.from_config(config)
    try:
        algorithm = build_algorithm(config, engine)
        assert isinstance(algorithm, MergingAlgorithm)
        _play(config, engine, algorithm, range(1, 13))
        open_windows = [w for w in algorithm.merges.windows.values() if w.probes or w.own]
        assert open_windows and algorithm.merged_into()  # mid-test, after a merge
        resumed = build_algorithm(config, engine)
        resumed.load_state_dict(copy.deepcopy(algorithm.state_dict()))  # as from disk
        _play(config, engine, algorithm, range(13, 21))
        _play(config, engine, resumed, range(13, 21))
        assert [d.as_dict() for d in resumed.decisions] == [
            d.as_dict() for d in algorithm.decisions]
        assert any(d.kind == "merge" and d.round > 12 for d in algorithm.decisions)
        assert resumed.clusters() == algorithm.clusters()
        assert all(torch.equal(resumed.model_of(c), algorithm.model_of(c)) for c in range(24))
    finally:
        engine.close()


@pytest.mark.parametrize("min_part_size", [2, 1])
def test_min_part_size_folds_a_lone_outlier_back_instead_of_a_cluster_of_one(
        min_part_size: int) -> None:
    """One group and an outlier (a window's only structure): the best cut sets it apart; at
    min_part_size 2 CFL folds it back and makes no split, at 1 (the default) a cluster of
    one member."""
    updates = groups_and_outliers([14], 1, spread=0.5).float()
    alg = make_algorithm("cfl", 15, updates.shape[1], warmup_rounds=0, patience=1,
                         min_part_size=min_part_size)
    out = alg.aggregate_train(1, [update_reply(c, updates[c]) for c in range(15)])
    if min_part_size == 2:
        assert alg.clusters() == [list(range(15))] and not alg.decisions
        assert out["clusters"][0]["lone_parts_only"]  # the round's metrics say why
    else:
        assert alg.clusters() == [list(range(14)), [14]]
        assert alg.decisions[0].figures["kway_f"] > alg.params.f_threshold
