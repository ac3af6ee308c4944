"""Members that change cluster (`algorithms.reselection`): the client's test of a clearly better
model, the select task keeping the current one otherwise, and the server's two conditions for a
move (the member is misplaced in a cluster that serves its other members; its update agrees with
the chosen cluster's members'), which keep sign-flipping attackers out."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedflock.algorithms.base import Cluster
from fedflock.algorithms.reselection import admission
from fedflock.client.tasks import Select, Train, clearly_better
from fedflock.report.document import splits_table
from fedflock.report.load import RunData
from fedflock.wire import Reply
from tests.conftest import make_algorithm, small_runtime, update_reply

LEVEL = 1e-3


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 600), st.floats(0, 1), st.floats(0, 1))
def test_a_model_is_never_clearly_better_than_an_equal_or_better_one(
        samples: int, a: float, b: float) -> None:
    low, high = sorted((a, b))
    assert not clearly_better(high, low, samples, LEVEL)
    assert not clearly_better(low, low, samples, LEVEL)


def test_clearly_better_needs_a_gap_the_samples_can_show() -> None:
    assert clearly_better(0.25, 0.78, 135, LEVEL)  # an intruder on the wrong group's model
    assert clearly_better(0.0, 0.83, 135, LEVEL)
    assert not clearly_better(0.88, 0.90, 135, LEVEL)  # congruent groups' models
    assert not clearly_better(0.99, 1.0, 100, LEVEL)  # one miss against a perfect fit
    assert not clearly_better(0.5, 1.0, 10, LEVEL)  # too few samples to tell
    assert clearly_better(0.5, 1.0, 100, LEVEL)


def test_select_keeps_the_current_model_unless_another_is_clearly_better() -> None:
    runtime = small_runtime()
    start = runtime.initial_params()
    trained = start.clone()
    for rnd in range(1, 41):  # to about 90% of its 40 samples
        trained += Train(0, rnd, trained).run(runtime).update
    almost = trained * (1 + 1e-4)
    close = Select(0, 1, torch.stack([trained, almost]), criterion="accuracy",
                   keep_level=LEVEL).run(runtime)
    assert close.choice == 0
    better = Select(0, 1, torch.stack([start, trained]), criterion="accuracy",
                    keep_level=LEVEL).run(runtime)
    assert better.choice == 1
    assert float(better.tensors["scores"][1, 0]) > float(better.tensors["scores"][0, 0])
    # its update was computed at the model it chose: the plain training of that model
    assert torch.equal(better.update, Train(0, 1, trained).run(runtime).update)


SIZE = 8
E = torch.eye(SIZE)


def _two_clusters(settled: bool = True, **params: object):
    alg = make_algorithm("cfl", 6, SIZE, **{"reselect": True, **params})
    alg._clusters = [Cluster(1, [0, 1, 2], torch.zeros(SIZE)), Cluster(2, [3, 4, 5],
                                                                    torch.ones(SIZE))]
    alg._next_id = 3
    alg._index_members()
    for cluster_id in (1, 2) if settled else ():  # models whose change stopped shrinking
        alg.watches[cluster_id].stability.changes = [0.01] * 2 * alg.params.patience
    return alg


def _select_reply(client: int, choice: int, update: torch.Tensor) -> Reply:
    scores = torch.tensor([[0.2, 2.0], [0.9, 0.3]])
    if choice == 0:
        scores = scores.flip(0)
    return Reply(client, {"update": update.clone(), "scores": scores},
                 {"choice": float(choice), "loss": 0.3}, 100)


def _member(client: int, cluster: int) -> Reply:
    """A member's update at its cluster's model: the cluster's direction and some of its own."""
    return update_reply(client, E[cluster - 1] + 0.3 * E[2 + client])


def _first_round(alg) -> None:
    tasks = alg.configure_train(1, [0, 1, 3, 4])
    assert all(isinstance(t, Select) and t.keep_level == LEVEL for t in tasks)
    own = {0: 0.0, 1: 0.0, 3: 1.0, 4: 1.0}
    assert all(float(t.models[0, 0]) == own[t.client] for t in tasks)  # its own model first
    alg.aggregate_train(1, [_select_reply(c, 0, _member(c, 1 if c < 3 else 2).update)
                            for c in (0, 1, 3, 4)])


def test_admission_compares_with_the_members_agreement_at_the_same_model() -> None:
    members = [E[1] + 0.3 * E[2], E[1] + 0.3 * E[3]]  # each other's cosine: 1 / 1.09
    cosine, bar = admission(E[1] + 0.1 * E[0], members)
    assert bar == pytest.approx(1 / 1.09, abs=1e-6) and cosine > bar
    assert admission(-E[1], members)[0] < 0  # a flipped update opposes them
    assert admission(torch.zeros(SIZE), members)[0] == 0  # a zero update has no direction
    assert admission(E[1], members[:1]) is None  # one member: nothing to compare with


def test_a_member_moves_when_its_update_agrees_with_the_chosen_clusters_members() -> None:
    alg = _two_clusters()
    _first_round(alg)
    alg.watches[1].window.updates[2] = E[0]  # an update of client 2 in its cluster's open window
    first = alg._clusters[0].params.clone()
    tasks = alg.configure_train(2, [0, 1, 2, 3, 4, 5])
    # clients 0, 1, 3 and 4 chose among these clusters in round 1: they train their own
    assert [type(t) for t in tasks] == [Train, Train, Select, Train, Train, Select]
    out = alg.aggregate_train(2, [_member(0, 1), _member(1, 1), _member(3, 2), _member(4, 2),
                                  _select_reply(2, 1, E[1] + 0.1 * E[0]),  # agrees: admitted
                                  _select_reply(5, 1, -E[0])])  # opposes (a flip): refused
    assert alg.clusters() == [[0, 1], [2, 3, 4, 5]]
    assert (out["moves"], out["refused_moves"]) == (1, 1)
    # the refused update went nowhere: cluster 1 took its two members' only
    assert torch.allclose(alg._clusters[0].params, first + E[0] + 0.15 * (E[2] + E[3]))
    assert 2 not in alg.watches[1].window.updates
    move = alg.decisions[-1].as_dict()
    assert (move["kind"], move["parent"], move["children"], move["members"]) == (
        "move", 1, [2], [[2]])
    assert (move["accuracy_own"], move["accuracy_chosen"]) == (0.2, 0.9)
    assert move["cosine_to_members"] > move["members_median"] > 0
    assert move["members_replied"] == 2
    # the refused client may choose again; the admitted one not until the clusters change
    assert [type(t) for t in alg.configure_train(3, [2, 5])] == [Train, Select]


def test_a_cluster_that_serves_none_of_its_members_is_not_left() -> None:
    """Attackers whose own model diverged find the benign model clearly better, as an intruder
    does; unlike an intruder's, their cluster serves none of its members."""
    alg = _two_clusters()
    _first_round(alg)
    alg._reselected.clear()  # (as if the settled clusters had changed since round 1)
    alg.configure_train(2, [0, 1, 2, 3, 4])
    out = alg.aggregate_train(2, [_select_reply(3, 0, _member(3, 2).update),
                                  _select_reply(4, 0, _member(4, 2).update)]
                              + [_select_reply(c, 1, _member(c, 2).update) for c in (0, 1, 2)])
    assert alg.clusters() == [[0, 1, 2], [3, 4, 5]]
    assert (out.get("moves", 0), out["refused_moves"]) == (0, 3)


def test_a_resumed_run_admits_the_same_moves() -> None:
    alg = _two_clusters()
    _first_round(alg)
    resumed = _two_clusters()
    resumed.load_state_dict(copy.deepcopy(alg.state_dict()))  # as read from a checkpoint
    for run in (alg, resumed):
        assert [type(t) for t in run.configure_train(2, [0, 2, 3, 4])] == [
            Train, Select, Train, Train]
        run.aggregate_train(2, [_member(0, 1), _member(3, 2), _member(4, 2),
                                _select_reply(2, 1, _member(2, 2).update)])
    assert alg.clusters() == resumed.clusters() == [[0, 1], [2, 3, 4, 5]]


def test_no_reselection_when_off_with_gradients_or_with_one_cluster() -> None:
    assert all(type(t) is Train for t in _two_clusters(reselect=False).configure_train(
        1, [0, 3]))
    # a model still learning its group is not left for one that fits better today
    assert all(type(t) is Train for t in _two_clusters(settled=False).configure_train(
        1, [0, 3]))
    assert all(type(t).__name__ == "Gradient" for t in _two_clusters(
        update="gradients").configure_train(1, [0, 3]))
    single = make_algorithm("cfl", 6, SIZE, reselect=True)
    assert all(type(t) is Train for t in single.configure_train(1, [0, 3]))


def test_moves_are_decisions_but_not_splits_in_a_report(tmp_path) -> None:
    run = RunData(tmp_path, summary={"splits": [
        {"kind": "split", "round": 3}, {"kind": "move", "round": 5, "rule": "reselect",
                                          "accuracy_own": 0.0613, "accuracy_chosen": 0.8234,
                                          "cosine_to_members": 0.2517},
        {"kind": "merge", "round": 7}]})
    assert run.split_rounds == [3]
    table = splits_table(run)
    assert "re-selection" in table and "at chosen" in table
    assert all(figure in table for figure in ("0.061", "0.823", "0.252"))
