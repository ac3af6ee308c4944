"""A dataset, a scenario and a model registered from outside the package (as a plugin would),
used by a run through the Python API: token-id inputs stay integer end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedflock.api import run
from fedflock.client.runtime import ClientRuntime
from fedflock.config import DataConfig, ModelConfig
from fedflock.data import DATASETS, SCENARIOS, ClientData, Dataset, FederatedData
from fedflock.data.spec import DataSpec
from fedflock.models import MODELS
from tests.conftest import small_config

VOCAB, LENGTH, CLASSES = 12, 6, 3


@DATASETS.register("test_tokens", "token sequences whose class is the most frequent token mod 3")
def _tokens(root: Path | None) -> Dataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (900, LENGTH), generator=gen)
    y = torch.mode(x % CLASSES, dim=1).values
    return Dataset("test_tokens", x[:700], y[:700], x[700:], y[700:], CLASSES,
                   vocab_size=VOCAB)


@MODELS.register("test_bag_of_embeddings", "embedding of each token, then a linear layer")
def _bag(data: DataSpec, cfg: ModelConfig) -> nn.Module:
    assert data.vocab_size == VOCAB
    return nn.Sequential(nn.Embedding(data.vocab_size, 8), nn.Flatten(),
                         nn.Linear(8 * data.input_shape[0], data.num_classes))


@SCENARIOS.register("test_halves", "the first half of the clients, then the second")
def _halves(ds: Dataset, cfg: DataConfig, seed: int, shift_seed: int) -> FederatedData:
    per = cfg.samples_per_client or 50
    rng = np.random.default_rng(seed)
    clients = []
    for _ in range(cfg.clients):
        tr, te = rng.choice(len(ds.y_train), per), rng.choice(len(ds.y_test), 20)
        clients.append(ClientData(ds.x_train[tr], ds.y_train[tr], ds.x_test[te], ds.y_test[te]))
    groups = (np.arange(cfg.clients) >= cfg.clients // 2).astype(np.int64)
    assert cfg.scenario.options == {"note": "own parameter"}
    return FederatedData(clients, groups, ds.num_classes, ds.input_shape, ds.name,
                         ds.objective, ds.vocab_size)


def _config() -> dict:
    return small_config(**{"data": {"dataset": "test_tokens", "clients": 4,
                                    "samples_per_client": 60,
                                    "scenario": {"kind": "test_halves",
                                                 "options": {"note": "own parameter"}}},
                           "model": {"name": "test_bag_of_embeddings"}, "rounds": 4})


def test_registered_dataset_scenario_and_model_run_with_integer_inputs(tmp_path: Path) -> None:
    result = run(_config(), tmp_path / "tokens")
    assert result.summary["true_groups"] == [0, 0, 1, 1]
    assert result.summary["accuracy"]["mean"] > 1 / CLASSES  # it learned something
    from fedflock.data.scenarios import build_federated_data
    from fedflock.validation import validate

    cfg = validate(_config())
    runtime = ClientRuntime(build_federated_data(cfg.data, 0), cfg.model, cfg.training, 0)
    assert runtime.client_data(0).x_train.dtype == torch.int64  # token ids were not cast
    assert runtime.data_spec.vocab_size == VOCAB


def test_every_builtin_scenario_is_documented_for_fedflock_list() -> None:
    from fedflock.config import BUILTIN_SCENARIOS
    from fedflock.data import SCENARIO_DOCS

    assert set(SCENARIO_DOCS) == set(BUILTIN_SCENARIOS)


def test_a_data_subspace_method_refuses_token_inputs_naming_itself_and_the_dataset(
        tmp_path: Path) -> None:
    from fedflock.errors import ConfigError

    raw = _config() | {"algorithm": {"name": "pacfl"}}
    with pytest.raises(ConfigError, match=r"'pacfl'.*'test_tokens'.*token sequences"):
        run(raw, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before any round
