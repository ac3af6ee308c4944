"""Executors differ in speed only: they must compute the same updates (checked in float64)."""

from __future__ import annotations

import pytest
import torch

from fedflock.client.executors import EXECUTORS, choose_executor
from fedflock.client.runtime import ClientRuntime
from fedflock.client.tasks import Evaluate, Gradient, Train
from fedflock.data.scenarios import build_federated_data
from fedflock.errors import ConfigError
from fedflock.validation import validate
from tests.conftest import small_config


def _runtime(model: str, **overrides: object) -> ClientRuntime:
    raw = small_config(**{
        "model.name": model,
        "training.dtype": "float64",
        "training.momentum": 0.9,
        "training.weight_decay": 1e-3,
        "training.batch_size": 16,
        "training.local_epochs": 2,
        # Unequal client sizes exercise the batched executor's padding and step masking.
        "data.scenario": {"kind": "quantity_skew", "quantity_sigma": 0.8},
        **overrides,
    })
    cfg = validate(raw)
    return ClientRuntime(build_federated_data(cfg.data, 0), cfg.model, cfg.training, 0)


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_all_executors_compute_the_same_updates(model: str) -> None:
    runtime = _runtime(model)
    sizes = {runtime.num_examples(c) for c in range(runtime.num_clients)}
    assert len(sizes) > 1, "the scenario should give clients different sizes"
    start = runtime.initial_params()
    tasks = [Train(c, 3, start) for c in range(runtime.num_clients)]
    results = {}
    for name in ("sequential", "batched", "processes"):
        with EXECUTORS.get(name)(runtime, 2) as executor:
            replies = executor.run(tasks)
        assert [r.client for r in replies] == list(range(runtime.num_clients))
        results[name] = torch.stack([r.update for r in replies])
        losses = torch.tensor([r.loss for r in replies])
        results[name + "_loss"] = losses
    assert results["sequential"].abs().sum() > 0
    for name in ("batched", "processes"):
        assert torch.allclose(results[name], results["sequential"], rtol=0, atol=1e-12), name
        assert torch.allclose(results[name + "_loss"], results["sequential_loss"], atol=1e-10)


def test_local_steps_and_finetune_epochs_agree_across_executors() -> None:
    runtime = _runtime("mlp", **{"training.local_steps": 5})
    start = runtime.initial_params()
    tasks = [Train(c, 1, start) for c in range(3)]
    tasks.append(Train(3, 1, start, epochs=3))
    tasks.append(Gradient(4, 1, start))
    seq = torch.stack([r.update for r in EXECUTORS.get("sequential")(runtime).run(tasks)])
    bat = torch.stack([r.update for r in EXECUTORS.get("batched")(runtime).run(tasks)])
    assert torch.allclose(seq, bat, atol=1e-12)


def test_same_seed_gives_identical_updates_and_another_round_differs() -> None:
    runtime = _runtime("mlp")
    start = runtime.initial_params()
    first = Train(0, 1, start).run(runtime).update
    again = Train(0, 1, start).run(runtime).update
    other = Train(0, 2, start).run(runtime).update
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_batched_rejects_batchnorm_models_with_one_clear_error() -> None:
    runtime = _runtime("cnn_bn")
    with pytest.raises(ConfigError, match="batched"):
        EXECUTORS.get("batched")(runtime)


def test_auto_never_picks_batched_on_cpu() -> None:
    runtime = _runtime("cnn")
    executor = choose_executor(runtime, "auto", None)
    try:
        assert executor.name != "batched" or torch.cuda.is_available()
    finally:
        executor.close()
    forced = choose_executor(runtime, "sequential", None)
    assert forced.name == "sequential"


def test_every_executor_evaluates_like_the_runtime() -> None:
    runtime = _runtime("cnn")
    start = runtime.initial_params()
    other = start + 0.01
    tasks = [Evaluate(c, 1, start if c % 2 else other) for c in range(runtime.num_clients)]
    expected = [t.run(runtime).metrics for t in tasks]  # one client at a time
    assert expected[0] != expected[1]
    for name in ("sequential", "processes"):
        with EXECUTORS.get(name)(runtime, 2) as executor:
            got = [r.metrics for r in executor.run(tasks)]
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert g.keys() == e.keys() == {"accuracy", "loss"}
            assert g == pytest.approx(e, abs=1e-9)
