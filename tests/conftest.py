"""Shared fixtures. Real data come from ../shared/data (or $FEDFLOCK_DATA).

Outside CI a test needing those files is skipped when they are absent; in CI (CI=true) it fails
with a clear message instead, so a missing data folder can never pass silently.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _data_root() -> Path:
    env = os.environ.get("FEDFLOCK_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    root = _data_root()
    if not (root / "mnist").is_dir():
        message = (f"real datasets not found at {root} (set FEDFLOCK_DATA or place "
                   "../shared/data beside the repository)")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return root


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                    ) -> None:
    """Decoded-dataset cache shared by the session's tests, never the user's home."""
    cache = tmp_path_factory.getbasetemp() / "fedflock-cache"
    monkeypatch.setenv("FEDFLOCK_CACHE", str(cache))
    monkeypatch.setenv("FEDFLOCK_QUIET", "1")


@pytest.fixture
def cli(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    """`cli(*args) -> (exit status, stderr)`: `fedflock ARGS` run by the CLI's own `main` in
    this process, as the `fedflock` script runs it, without an interpreter start-up."""
    from fedflock.cli import main

    def call(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["fedflock", *args])
        with pytest.raises(SystemExit) as done:
            main()
        return int(done.value.code or 0), capsys.readouterr().err

    return call


def one_error_line(code: int, stderr: str, *words: str) -> None:
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), stderr
    assert "Traceback" not in stderr
    for word in words:
        assert word in lines[0], lines[0]


def small_config(**overrides: object) -> dict:
    """A seconds-long digits experiment as a raw config mapping."""
    raw: dict = {
        "seed": 0,
        "rounds": 3,
        "data": {"dataset": "digits", "clients": 6, "samples_per_client": 40,
                 "test_per_client": 10, "scenario": {"kind": "label_permutation", "groups": 2}},
        "model": {"name": "mlp", "hidden": [32]},
        "training": {"local_epochs": 1, "lr": 0.1, "batch_size": 16, "executor": "sequential"},
        "algorithm": {"name": "fedavg"},
        "checkpoint_every": 1,
    }
    return apply_dotted(raw, overrides)


def tiny_text_config(root: Path, algorithm: str = "fedavg", **algorithm_params: object
                     ) -> dict:
    """Two rounds of a tiny next-token federation on AG News: 4 clients of 2 topics, 12
    sequences of 8 tokens each, a one-layer LSTM of width 8."""
    return {"seed": 0, "rounds": 2, "eval_every": 2,
            "data": {"dataset": "agnews", "root": str(root), "clients": 4,
                     "samples_per_client": 12, "test_per_client": 6,
                     "scenario": {"kind": "topics", "groups": 2},
                     "text": {"vocab_size": 200, "seq_len": 8}},
            "model": {"name": "lstm_lm", "embedding": 8, "hidden": [8], "layers": 1},
            "training": {"local_epochs": 1, "lr": 0.5, "batch_size": 4,
                         "executor": "sequential"},
            "algorithm": {"name": algorithm, **algorithm_params}}


def apply_dotted(raw: dict, overrides: dict) -> dict:
    """Set `a.b.c`-keyed values in a nested config mapping (sections created as needed)."""
    for key, value in overrides.items():
        node = raw
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return raw


def make_algorithm(name: str, num_clients: int, size: int, **params: object):
    """An algorithm on a bare context: a zero initial model of `size`, all of it trainable, and
    seeded standard-normal rows after it when K initial models are asked for."""
    import torch

    from fedflock.algorithms import ALGORITHMS, AlgorithmContext

    def initial_models(count: int) -> torch.Tensor:
        rest = torch.randn(count - 1, size, generator=torch.Generator().manual_seed(count))
        return torch.cat([torch.zeros(1, size), rest])

    cls = ALGORITHMS.get(name)
    context = AlgorithmContext(num_clients, torch.zeros(size), size,
                               make_initial_models=initial_models)
    return cls(cls.Params(**params), context)


def update_reply(client: int, update, examples: int = 10, loss: float = 0.1):
    """A train reply carrying `update`."""
    from fedflock.wire import Reply

    return Reply(client, {"update": update.clone()}, {"loss": loss}, examples)


def small_runtime():
    """The client side of `small_config()`'s federation: every client's data and the model."""
    from fedflock.client.runtime import ClientRuntime
    from fedflock.data.scenarios import build_federated_data
    from fedflock.validation import validate

    cfg = validate(small_config())
    return ClientRuntime(build_federated_data(cfg.data, cfg.seed), cfg.model, cfg.training,
                         cfg.seed)


def groups_and_outliers(sizes: list[int], outliers: int, spread: float = 1.0, seed: int = 0):
    """Updates of groups (a shared direction plus `spread` times as much noise each) and of
    outliers (noise of three times that norm, like a client with noisy inputs)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    directions = rng.normal(size=(len(sizes), 5000))
    rows = [directions[g] + spread * rng.normal(size=(n, 5000)) for g, n in enumerate(sizes)]
    return torch.from_numpy(np.vstack([*rows, 3 * rng.normal(size=(outliers, 5000))]))


def one_community(weights, *_, **__):
    """Stand-in for `incremental.nested_communities` that finds a single community (Louvain's
    first level still reported): for tests that need a first clustering to find nothing."""
    from fedflock.clustering.communities import NestedCommunities, louvain

    everyone = [list(range(weights.shape[0]))]
    return NestedCommunities(louvain(weights), everyone, everyone)
