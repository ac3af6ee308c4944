"""One module of server logic per method, found by name through `ALGORITHMS`."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from fedflock.algorithms import (  # noqa: F401 (register)
    cfl,
    distfl,
    fedavg,
    fedavg_ft,
    fedbabu,
    feddag,
    fedem,
    fedper,
    fedrc,
    fedsoft,
    flhc,
    ifca,
    incremental,
    local,
    oracle,
    pacfl,
    robust,
)
from fedflock.algorithms.base import Algorithm, AlgorithmContext, AlgorithmParams, Decision
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.config import AlgorithmConfig, format_validation_error
from fedflock.errors import ConfigError


def validate_params(cfg: AlgorithmConfig) -> BaseModel:
    """The algorithm's own typed parameters; a bad key or value is one `ConfigError` line."""
    if cfg.name not in ALGORITHMS:
        raise ConfigError(f"config: algorithm.name: unknown algorithm {cfg.name!r} "
                          f"(expected one of: {', '.join(ALGORITHMS)})")
    cls = ALGORITHMS.get(cfg.name)
    try:
        return cls.Params.model_validate(cfg.params())
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, "algorithm")) from None


__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmContext", "AlgorithmParams", "Decision",
           "validate_params"]
