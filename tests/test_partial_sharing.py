"""Partial sharing: the model's named layers, an aggregation plan over parameter blocks, and
FedPer (a shared body, each client's head its own) as its user."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedflock.algorithms.blocks import Part, blockwise_mean, examples
from fedflock.engines.embedded import EmbeddedEngine
from fedflock.errors import ConfigError
from fedflock.experiment import build_algorithm
from fedflock.validation import validate
from fedflock.wire import Reply
from tests.conftest import small_config


def _engine(**overrides: object) -> tuple[EmbeddedEngine, object]:
    config = validate(small_config(**overrides))
    engine = EmbeddedEngine.from_config(config)
    return engine, build_algorithm(config, engine)


def test_layers_are_the_modules_with_parameters_and_a_mask_covers_their_blocks() -> None:
    engine, _ = _engine(**{"model": {"name": "cnn_bn"}})
    try:
        handle = engine.model_handle()
        layers = handle.layers()
        assert len(layers) == len(set(layers)) and len(layers) >= 3
        last = handle.mask([layers[-1]])
        blocks = [b for b in handle.blocks if b.name.rsplit(".", 1)[0] == layers[-1]]
        assert int(last.sum()) == sum(b.stop - b.start for b in blocks)
        norm = next(b for b in handle.blocks if b.name.endswith("running_mean"))
        owner = norm.name.rsplit(".", 1)[0]
        assert bool(handle.mask([owner])[norm.start : norm.stop].all())  # buffers go along
        with pytest.raises(ValueError, match="no layer nope in the model"):
            handle.mask(["nope"])
    finally:
        engine.close()


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 5), st.integers(2, 12), st.data())
def test_each_part_is_the_weighted_mean_of_its_replies_and_the_rest_stays(
        rows: int, size: int, data: st.DataObject) -> None:
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 10_000)))
    updates = torch.randn(rows, size, generator=gen, dtype=torch.float64)
    replies = [Reply(c, {"update": updates[c]}, {"loss": 0.0}, c + 1) for c in range(rows)]
    owner = torch.tensor(data.draw(st.lists(st.integers(-1, 1), min_size=size, max_size=size)))
    weights = [torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 0.5, 2.0]),
                                               min_size=rows, max_size=rows)),
                            dtype=torch.float64) for _ in range(2)]
    plan = [Part(owner == k, weights[k]) for k in range(2)]
    out = blockwise_mean(replies, plan)
    for k, part in enumerate(plan):
        total = float(weights[k].sum())
        want = (weights[k] @ updates / total if total > 0 else torch.zeros(size,
                                                                            dtype=torch.float64))
        assert torch.allclose(out[part.mask], want[part.mask])
    assert bool((out[owner == -1] == 0).all())
    with pytest.raises(ValueError, match="overlap"):
        blockwise_mean(replies, [Part(torch.ones(size, dtype=torch.bool), examples(replies))] * 2)


def test_fedper_shares_the_body_and_keeps_each_clients_head() -> None:
    engine, algorithm = _engine(**{"algorithm": {"name": "fedper"}, "data.clients": 4})
    try:
        head = algorithm.head
        assert 0 < int(head.sum()) < len(head)
        initial = algorithm.model_of(0).clone()
        heads: dict[int, torch.Tensor] = {}
        for rnd in (1, 2):
            tasks = algorithm.configure_train(rnd, [0, 1, 2])
            if rnd == 2:  # each client is sent the head it trained last round
                for task in tasks:
                    assert torch.equal(task.params[head], heads[task.client])
            replies = engine.run_tasks(rnd, tasks)
            algorithm.aggregate_train(rnd, replies)
            heads = {r.client: t.params[head] + r.update[head]
                     for r, t in zip(replies, tasks, strict=True)}
            models = [algorithm.model_of(c) for c in range(4)]
            assert all(torch.equal(m[~head], models[0][~head]) for m in models)  # one body
            for c in (0, 1, 2):
                assert torch.allclose(models[c][head], heads[c])
            assert torch.equal(models[3][head], initial[head])  # never sampled: shared head
        assert not torch.equal(models[0][head], models[1][head])
    finally:
        engine.close()


def test_fedper_refuses_a_head_that_leaves_no_body() -> None:
    with pytest.raises(ConfigError, match="personal_layers: 2 leaves no shared body"):
        _engine(**{"algorithm": {"name": "fedper", "personal_layers": 2}})


def test_a_dual_encoder_has_two_differently_drawn_encoders_and_one_classifier() -> None:
    from torch import nn

    from fedflock.api import run
    from fedflock.models.dual import dual_encoder

    engine, _ = _engine(**{"model": {"name": "mlp", "hidden": [16], "dual_encoder": True}})
    try:
        handle = engine.model_handle()
        layers = handle.layers()
        assert [layer.split(".")[0] for layer in layers] == ["primary", "secondary", "head"]
        model = handle.module()
        assert not torch.equal(model.primary[1].weight, model.secondary[1].weight)
        assert model.head.in_features == 32
    finally:
        engine.close()
    summary = run(small_config(**{"rounds": 2, "model": {"name": "mlp", "hidden": [16],
                                                         "dual_encoder": True}})).summary
    assert 0 <= summary["accuracy"]["mean"] <= 1
    with pytest.raises(ConfigError, match="not a sequence of layers ending in a linear"):
        dual_encoder(lambda: nn.Sequential(nn.Linear(4, 4), nn.ReLU()), "odd")


@pytest.mark.parametrize("settings", [
    {"training.executor": "batched", "training.weight_decay": 0.01, "training.momentum": 0.9},
    {"privacy.dp": {"mechanism": "dp-sgd", "epsilon": 8.0}},
], ids=["batched-executor-decay-momentum", "dp-sgd"])
def test_fedbabu_trains_the_body_and_never_moves_the_head(tmp_path: Path, settings: dict
                                                          ) -> None:
    from fedflock.api import run

    raw = small_config(**{"rounds": 2, "algorithm": {"name": "fedbabu", "finetune_epochs": 1},
                          **settings})
    run(raw, tmp_path / "run")
    engine, algorithm = _engine(**{k: v for k, v in raw.items() if k != "privacy"})
    try:
        initial, body = engine.initial_models(1)[0], algorithm.body.bool()
    finally:
        engine.close()
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    (cluster,) = state["algorithm"]["clusters"]
    shared = cluster["params"]
    assert torch.equal(shared[~body], initial[~body])  # the head: the random start
    assert not torch.allclose(shared[body], initial[body])  # the body learned
