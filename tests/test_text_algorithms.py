"""Every registered algorithm on a next-token task: it runs two rounds on a tiny AG News
federation and reports perplexity, or it refuses in one line that names it and says why."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedflock.algorithms import ALGORITHMS
from fedflock.errors import ConfigError
from fedflock.experiment import run_experiment
from fedflock.validation import validate
from tests.conftest import tiny_text_config

# What a method needs to run at this size (two clusters for the K-model methods).
SETTINGS = {"ifca": {"clusters": 2}, "fedsoft": {"clusters": 2}, "fedem": {"clusters": 2},
            "cfl": {"warmup_rounds": 0, "patience": 1}, "incremental": {"cluster_round": 1}}
REFUSES = {"pacfl": "class", "feddag": "class", "fedrc": "label marginal", "distfl": "BatchNorm"}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_runs_on_next_token_data_or_refuses_in_one_line(
        shared_data: Path, tmp_path: Path, name: str) -> None:
    config = validate(tiny_text_config(shared_data, name, **SETTINGS.get(name, {})))
    if name in REFUSES:
        with pytest.raises(ConfigError) as refused:
            run_experiment(config, tmp_path / name, quiet=True)
        message = str(refused.value)
        assert "\n" not in message and name in message and REFUSES[name] in message, message
        assert not (tmp_path / name).exists()  # refused before the run directory is made
        return
    summary = run_experiment(config, tmp_path / name, quiet=True)
    assert summary["primary_metric"] == "perplexity"
    assert math.isfinite(summary["perplexity"]["mean"]) and summary["perplexity"]["mean"] > 1
