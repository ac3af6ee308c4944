"""Read the fedflock experiment from a Flower run config (`[tool.flwr.app.config]`).

Keys: `config` (path of the fedflock YAML), `set` (overrides `key.path=value`, separated by `;`),
`out` (run directory written by the ServerApp), `round-timeout` (seconds to wait for replies),
`plugins` (modules registering user components, separated by `;`, loaded by server and clients),
`resume` (true: continue the run in `out` from its last checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedflock.config import ExperimentConfig
from fedflock.errors import ConfigError
from fedflock.plugins import load_plugins
from fedflock.validation import load_config


def experiment_config(run_config: Mapping[str, Any]) -> ExperimentConfig:
    if "config" not in run_config:
        raise ConfigError("flower run config: 'config' (path of the fedflock YAML) is missing")
    load_plugins(s.strip() for s in str(run_config.get("plugins", "")).split(";"))
    overrides = [s.strip() for s in str(run_config.get("set", "")).split(";") if s.strip()]
    return load_config(Path(str(run_config["config"])), overrides)
