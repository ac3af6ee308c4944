"""A config as the rest of fedflock may trust it: its structure (`fedflock.config`) and the
names it gives, checked against the registries (datasets, models, objectives, algorithms with
their own typed parameters). Kept above `config`, so that config imports nothing above it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedflock.algorithms import ALGORITHMS, validate_params
from fedflock.config import (
    BUILTIN_SCENARIOS,
    AlgorithmConfig,
    ExperimentConfig,
    apply_overrides,
    load_raw,
    parse_config,
)
from fedflock.data import DATASETS, SCENARIOS
from fedflock.errors import ConfigError
from fedflock.models import MODELS
from fedflock.privacy.dp import prepare as prepare_dp


def validate(raw: dict[str, Any]) -> ExperimentConfig:
    """A raw mapping as a checked config; every problem is one `ConfigError` line."""
    config = parse_config(raw)
    for key, registry, name in (("data.dataset", DATASETS, config.data.dataset),
                                ("model.name", MODELS, config.model.name)):
        if name not in registry:
            raise ConfigError(f"config: {key}: unknown {registry.kind} {name!r} "
                              f"(expected one of: {', '.join(registry)})")
    kind = config.data.scenario.kind
    if kind not in BUILTIN_SCENARIOS and kind not in SCENARIOS:
        known = ", ".join([*BUILTIN_SCENARIOS, *SCENARIOS])
        raise ConfigError(f"config: data.scenario.kind: unknown scenario {kind!r} "
                          f"(expected one of: {known})")
    params = validate_params(config.algorithm)
    if config.privacy.dp is not None:  # the clients' noise depends on the run's length
        prepare_dp(config.privacy.dp, config.rounds, ALGORITHMS.get(config.algorithm.name),
                   params)
    return config


def resolved(config: ExperimentConfig) -> ExperimentConfig:
    """The config with every parameter of its algorithm spelled out, defaults included: what a
    run directory's config.yaml records, so it says what the run used even after a default
    changes (and `--resume` compares settings, not what happened to be written)."""
    params = validate_params(config.algorithm).model_dump(mode="json")
    algorithm = AlgorithmConfig(name=config.algorithm.name, **params)
    return config.model_copy(update={"algorithm": algorithm})


def load_config(path: Path, overrides: list[str] | None = None) -> ExperimentConfig:
    return validate(apply_overrides(load_raw(path), overrides or []))
