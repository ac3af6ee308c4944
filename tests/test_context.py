"""What an algorithm may know: its context (initial models, model handle, ground truth only for
evaluation references) and the masking rule for algorithms that need the model layout."""

from __future__ import annotations

import itertools

import pytest
import torch

from fedflock.algorithms.fedavg import FedAvg
from fedflock.engines.embedded import EmbeddedEngine
from fedflock.errors import ConfigError
from fedflock.experiment import build_algorithm
from fedflock.validation import validate
from tests.conftest import small_config


def _engine(**overrides: object) -> EmbeddedEngine:
    return EmbeddedEngine.from_config(validate(small_config(**overrides)))


def test_the_model_handle_builds_modules_and_describes_the_blocks() -> None:
    engine = _engine(**{"model.name": "cnn_bn"})
    try:
        handle = engine.model_handle()
        assert handle is not None
        initial = engine.initial_models(1)[0]
        module = handle.module(initial)
        assert torch.equal(handle.vector(module), initial)
        blocks = handle.blocks
        assert blocks[0].start == 0 and blocks[-1].stop == initial.numel()
        assert all(a.stop == b.start for a, b in itertools.pairwise(blocks))
        trainable = [b for b in blocks if b.trainable]
        assert trainable[-1].stop == engine.update_size  # parameters first, BN buffers after
        assert any("running_mean" in b.name and not b.trainable for b in blocks)
        first = blocks[0]
        assert tuple(first.of(initial).shape) == (first.stop - first.start,)
    finally:
        engine.close()


def test_initial_models_are_distinct_seeded_and_start_with_the_runs_model() -> None:
    engine = _engine()
    try:
        three = engine.initial_models(3)
        assert three.shape[0] == 3 and torch.equal(three, engine.initial_models(3))
        assert torch.equal(three[0], engine.runtime.initial_params())
        assert not torch.equal(three[1], three[2])
    finally:
        engine.close()


def test_masking_hides_the_layout_and_an_algorithm_needing_it_refuses_masking(
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = validate(small_config(**{"privacy.masking": True}))
    engine = EmbeddedEngine.from_config(config)
    try:
        assert engine.model_handle() is None
        algorithm = build_algorithm(config, engine)
        assert algorithm.context.model is None and algorithm.context.true_groups is None
        monkeypatch.setattr(FedAvg, "needs_model", True)  # as DistFL will declare
        with pytest.raises(ConfigError, match="masking"):
            build_algorithm(config, engine)
    finally:
        engine.close()


def test_only_evaluation_references_see_the_true_groups() -> None:
    config = validate(small_config(**{"algorithm.name": "oracle"}))
    engine = EmbeddedEngine.from_config(config)
    try:
        oracle = build_algorithm(config, engine)
        assert oracle.context.true_groups is not None
        assert sorted(map(sorted, oracle.clusters())) == sorted(
            sorted(int(c) for c in (engine.true_groups == g).nonzero()[0])
            for g in set(engine.true_groups.tolist()))
    finally:
        engine.close()
