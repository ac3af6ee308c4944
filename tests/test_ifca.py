"""IFCA's server logic on hand-built replies, and the farthest-point seeding it can start from."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedflock.client.tasks import Select, Train
from fedflock.clustering.seeding import farthest_point_seeds, nearest_seed
from fedflock.wire import Reply
from tests.conftest import make_algorithm, update_reply


def _select_reply(client: int, choice: int, update: torch.Tensor, examples: int) -> Reply:
    return Reply(client, {"update": update, "scores": torch.zeros(3, 2)},
                 {"loss": 0.5, "choice": float(choice)}, examples)


def test_models_average_their_choosers_updates_and_an_empty_model_is_kept() -> None:
    ifca = make_algorithm("ifca", 4, 2, clusters=3)
    before = [m.clone() for m in ifca.models]
    tasks = ifca.configure_train(1, [0, 1, 2, 3])
    assert all(isinstance(t, Select) and t.criterion == "loss" for t in tasks)
    assert tasks[0].models is tasks[1].models and tasks[0].models.shape == (3, 2)
    ifca.aggregate_train(1, [_select_reply(0, 0, torch.tensor([1.0, 0]), 10),
                             _select_reply(1, 0, torch.tensor([0.0, 1]), 30),
                             _select_reply(2, 2, torch.tensor([2.0, 2]), 5),
                             _select_reply(3, 2, torch.tensor([4.0, 4]), 5)])
    assert torch.allclose(ifca.models[0], before[0] + torch.tensor([0.25, 0.75]))
    assert torch.equal(ifca.models[1], before[1])  # nobody chose it
    assert torch.allclose(ifca.models[2], before[2] + torch.tensor([3.0, 3.0]))
    assert sorted(map(sorted, ifca.clusters())) == [[0, 1], [2, 3]]
    assert ifca.model_of(3) is ifca.models[2]


def test_final_choice_is_made_without_training_for_every_client() -> None:
    ifca = make_algorithm("ifca", 3, 2, clusters=2)
    tasks = ifca.final_tasks(5, [0, 1, 2])
    assert [t.train for t in tasks] == [False, False, False]
    ifca.finalize([Reply(c, {"scores": torch.zeros(2, 2)}, {"loss": 1.0, "choice": float(c % 2)},
                         4) for c in range(3)])
    assert ifca.unplaced() == [] and ifca.final_tasks(5, [0, 1, 2]) == []
    assert sorted(map(sorted, ifca.clusters())) == [[0, 2], [1]]


def test_client_initialisation_seeds_one_model_per_direction() -> None:
    ifca = make_algorithm("ifca", 6, 3, clusters=3, init="clients")
    tasks = ifca.configure_train(1, list(range(6)))
    assert all(isinstance(t, Train) for t in tasks)
    directions = torch.eye(3)
    gen = torch.Generator().manual_seed(0)
    replies = [update_reply(c, directions[c % 3] + 0.05 * torch.randn(3, generator=gen))
               for c in range(6)]
    ifca.aggregate_train(1, replies)
    assert sorted(map(sorted, ifca.clusters())) == [[0, 3], [1, 4], [2, 5]]
    for c in range(3):
        model = ifca.model_of(c)
        assert int(model.argmax()) == c  # the mean update of its own direction
    assert ifca.decisions[0].kind == "seed"
    assert all(isinstance(t, Select) for t in ifca.configure_train(2, [0, 1]))


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10_000))
def test_farthest_point_seeds_hit_every_well_separated_group(k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, k, size=40)
    groups[:k] = np.arange(k)  # every group present
    centres = np.linalg.qr(rng.normal(size=(20, k)))[0].T  # orthonormal directions
    points = centres[groups] + 0.05 * rng.normal(size=(40, 20))
    unit = points / np.linalg.norm(points, axis=1, keepdims=True)
    similarity = unit @ unit.T
    seeds = farthest_point_seeds(similarity, k)
    assert len(set(seeds)) == k and {int(groups[s]) for s in seeds} == set(range(k))
    assert (np.asarray(seeds)[nearest_seed(similarity, seeds)] >= 0).all()
    assert (groups[np.asarray(seeds)[nearest_seed(similarity, seeds)]] == groups).all()
