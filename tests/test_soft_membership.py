"""The soft-membership methods (FedEM, FedRC, FedSoft) and the seams they stand on: the
mixture round on a client (E-step from the weights sent, one update per model), FedRC's
division by label marginals, the evaluation of a mixture, the norm bound over every update a
reply carries, FedSoft's personal model and importance weights, its per-cluster selection, and
what a run reports (memberships, the alternative evaluations, K releases a round, the
memberships figure)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fedflock.api import run
from fedflock.client.tasks import (
    Evaluate,
    EvaluateMixture,
    MixtureTrain,
    SoftTrain,
)
from fedflock.engines.embedded import EmbeddedEngine
from fedflock.validation import validate
from tests.conftest import small_config, small_runtime


def _two_models(runtime) -> torch.Tensor:
    return runtime.initial_models(2)


def test_the_mixture_round_starts_from_the_weights_sent_and_trains_every_model() -> None:
    runtime = small_runtime()
    models = _two_models(runtime)
    first = MixtureTrain(0, 1, models).run(runtime)  # no weights yet: uniform
    MixtureTrain(0, 1, models).check(first)
    weights = first.tensors["weights"].double()
    assert float(weights.sum()) == pytest.approx(1) and first.tensors["updates"].shape == (
        2, models.shape[1])
    assert all(float(row.norm()) > 0 for row in first.tensors["updates"])  # both trained
    # A client sure of model 1 stays sure: the prior sent is the E-step's.
    sure = torch.tensor([1e-9, 1 - 1e-9])
    second = MixtureTrain(0, 2, models, sure).run(runtime)
    assert float(second.tensors["weights"][1]) > 0.99
    assert not torch.allclose(second.tensors["weights"].double(), weights)


def test_fedrc_divides_each_models_likelihood_by_its_label_marginal() -> None:
    runtime = small_runtime()
    models = _two_models(runtime)
    same = torch.zeros(2, 5, dtype=torch.float64)  # equal losses under both models
    labels = runtime.client_data(0).y_train[:5]
    plain = MixtureTrain(0, 1, models).responsibilities(runtime, same, labels)
    assert torch.allclose(plain, torch.full_like(plain, 0.5))
    classes = runtime.data_spec.num_classes
    marginals = torch.full((2, classes), 1.0 / classes, dtype=torch.float64)
    marginals[0, labels[0]] *= 4  # model 0 has seen class y_0 four times as often
    q = MixtureTrain(0, 1, models, label_marginals=marginals.float()).responsibilities(
        runtime, same, labels)
    assert float(q[0, 1]) == pytest.approx(0.8, abs=1e-6)  # so sample 0 leans to model 1
    reply = MixtureTrain(0, 1, models, label_marginals=marginals.float()).run(runtime)
    mass = reply.tensors["class_mass"]
    assert mass.shape == (2, classes)
    assert float(mass.sum()) == pytest.approx(runtime.client_data(0).num_train, rel=1e-5)


def test_a_mixture_is_scored_on_the_mixed_probabilities() -> None:
    runtime = small_runtime()
    models = _two_models(runtime)
    alone = [Evaluate(0, 1, m).run(runtime).metrics for m in models]
    one_hot = EvaluateMixture(0, 1, models, torch.tensor([0.0, 1.0])).run(runtime).metrics
    assert one_hot["accuracy"] == alone[1]["accuracy"]
    assert one_hot["loss"] == pytest.approx(alone[1]["loss"], rel=1e-5)
    mixed = EvaluateMixture(0, 1, models, torch.tensor([0.5, 0.5])).run(runtime).metrics
    # -log of a mean of probabilities lies below the mean of the two losses (Jensen)
    assert mixed["loss"] <= (alone[0]["loss"] + alone[1]["loss"]) / 2 + 1e-6
    assert math.isfinite(mixed["loss"])


def test_the_norm_bound_refuses_a_reply_with_one_huge_update_among_several() -> None:
    engine = EmbeddedEngine.from_config(validate(small_config()))
    engine.norm_bound = 10.0
    models = _two_models(engine.runtime)
    tasks = [MixtureTrain(c, 1, models) for c in range(6)]
    replies = engine.run_tasks(1, tasks)
    poisoned = replies[3].tensors["updates"].clone()
    poisoned[1] *= 1e6  # only the second model's update
    replies[3] = replies[3].with_tensors(updates=poisoned)
    kept = engine.accept(1, tasks, replies)
    assert [r.client for r in kept] == [0, 1, 2, 4, 5]
    assert engine.rejected[0]["client"] == 3 and "norm" in engine.rejected[0]["reason"]


def test_fedsoft_trains_the_personal_model_sent_and_replies_it_against_its_centre() -> None:
    runtime = small_runtime()
    centres = _two_models(runtime)
    first = SoftTrain(0, 1, centres, mu=0.1).run(runtime)  # no weights yet: estimated
    SoftTrain(0, 1, centres).check(first)
    u = first.tensors["importance"].double()
    assert float(u.min()) >= 1e-4 and first.choice == int(u.argmax())
    personal = centres[first.choice] + first.update  # what the server rebuilds
    u_sent = torch.tensor([0.3, 0.7])
    second = SoftTrain(0, 2, centres, personal, u_sent, mu=0.1).run(runtime)
    assert second.choice == 1 and torch.allclose(second.tensors["importance"], u_sent)
    trained_on = centres[1] + second.update
    assert not torch.allclose(trained_on, personal)
    # from the personal model, not from a centre: its distance to the personal model is the
    # one round's training
    assert float((trained_on - personal).norm()) < float((trained_on - centres[1]).norm())
    again = SoftTrain(0, 2, centres, personal, u_sent, mu=0.1).run(runtime)
    assert torch.equal(again.update, second.update)  # nothing kept on the client


def test_fedsoft_per_cluster_selection_draws_each_centres_share_by_its_weights() -> None:
    from fedflock.experiment import build_algorithm

    config = validate(small_config(**{"data.clients": 8, "algorithm": {
        "name": "fedsoft", "clusters": 2, "selection": "clusters"}}))
    engine = EmbeddedEngine.from_config(config)
    algorithm = build_algorithm(config, engine)
    algorithm.weights[:4] = torch.tensor([1.0, 1e-9], dtype=torch.float64)
    algorithm.weights[4:] = torch.tensor([1e-9, 1.0], dtype=torch.float64)
    for rnd in range(1, 6):
        picked = algorithm.participants(rnd, [0, 1, 2, 3])
        assert len([c for c in picked if c < 4]) == 2 and len([c for c in picked if c >= 4]) == 2


@pytest.mark.parametrize("name", ["fedem", "fedrc", "fedsoft"])
def test_a_soft_run_reports_memberships_its_alternative_and_its_releases(
        tmp_path: Path, name: str) -> None:
    settings = {"rounds": 2, "data.clients": 6, "participation.count": 3,
                "algorithm": {"name": name, "clusters": 2}}
    raw = small_config(**settings)
    summary = run(raw, tmp_path / name).summary
    memberships = torch.tensor(summary["memberships"])
    assert memberships.shape == (6, 2)
    assert torch.allclose(memberships.sum(1), torch.ones(6, dtype=memberships.dtype), atol=1e-5)
    (alternative,) = summary["alternatives"].values()
    other = alternative["accuracy"]
    assert len(other["per_client"]) == 6 and 0 <= other["mean"] <= 1
    assert set(summary["alternatives"]) == {"fedsoft": {"personal"}}.get(name, {"hard"})
    from fedflock.report import plots
    from fedflock.report.load import load_run

    assert plots.plot_memberships(load_run(tmp_path / name), tmp_path / "m.png") is not None
    clustered = sorted(c for part in summary["clusters"] for c in part)
    assert clustered == list(range(6))
    private = small_config(**settings, **{"privacy.dp": {"mechanism": "client", "epsilon": 8.0}})
    dp = run(private, tmp_path / f"{name}-dp").summary["dp"]
    assert dp["releases_per_client"] == (2 if name == "fedsoft" else 2 * 2)  # rounds (x K)


def test_fedrc_refuses_an_objective_without_a_label_marginal() -> None:
    from fedflock.algorithms.base import AlgorithmContext
    from fedflock.algorithms.fedrc import FedRC
    from fedflock.data.spec import DataSpec
    from fedflock.errors import ConfigError

    text = DataSpec((16,), 50, objective="next_token", vocab_size=50)
    context = AlgorithmContext(num_clients=2, initial=torch.zeros(4), update_size=4,
                               data_spec=text, dataset="tiny_text")
    with pytest.raises(ConfigError, match=r"'fedrc'.*label marginal.*'next_token'.*'tiny_text'"):
        FedRC(FedRC.Params(clusters=2), context)
