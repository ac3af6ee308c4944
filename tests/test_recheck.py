"""Clustering that corrects itself: the stabilisation test, the windowed split test that keeps
examining a cluster, and incremental clustering repairing an under-split with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedflock.clustering.stability import Stabilisation
from fedflock.clustering.watch import SplitWatch, WindowRule
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
    watch = SplitWatch(WindowRule(patience, 0.1, coverage=0.5, min_size=3,
                                  same_round_share=None))
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
    unsettled = SplitWatch(WindowRule(2, 0.1, 0.5, 3, None))
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
        watch = SplitWatch(WindowRule(2, 0.1, 0.5, 3, share))
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
    from fedflock.clustering import stored_updates

    # the first clustering forced to find one community (the windows' evidence would part it)
    monkeypatch.setattr(stored_updates, "nested_communities", one_community)
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


def test_a_split_needs_patience_windows_in_a_row() -> None:
    watch = _settled_watch(patience=3)
    assert [watch.fires(s, 3.5) for s in [5, 5, 1, 5, 5, 5]] == [False] * 5 + [True]


def test_a_lone_outlier_of_the_best_cut_becomes_a_cluster_of_one() -> None:
    """One group and an outlier (a window's only structure): the best cut sets it apart, and
    CFL splits it off as a cluster of one member."""
    updates = groups_and_outliers([14], 1, spread=0.5).float()
    alg = make_algorithm("cfl", 15, updates.shape[1], warmup_rounds=0, patience=1)
    alg.aggregate_train(1, [update_reply(c, updates[c]) for c in range(15)])
    assert alg.clusters() == [list(range(14)), [14]]
    assert alg.decisions[0].figures["kway_f"] > alg.params.f_threshold
