"""fedflock from Python: run an experiment from a config and get its results back.

    from fedflock.api import run
    result = run({"data": {"dataset": "digits", "clients": 8}, "rounds": 5,
                  "algorithm": {"name": "ifca", "clusters": 2}})
    result.summary["accuracy"]["mean"], result.metrics[-1]

Components defined in your own module register themselves on import (see
`fedflock.plugins`); pass `plugins=["my_module"]` (or a `.py` path). Importing the module
yourself registers it in this process only: with `engine: flower` the ServerApp and ClientApps
load what `plugins=` or `FEDFLOCK_PLUGINS` names, from the folder it was imported from here.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedflock.config import ExperimentConfig, apply_overrides, load_raw
from fedflock.experiment import run_experiment
from fedflock.plugins import load_plugins
from fedflock.report.load import read_metrics
from fedflock.rundir import RunDirectory
from fedflock.validation import validate


@dataclass
class Result:
    """A finished run: its summary.json, its per-round metrics and where it was written."""

    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    out: Path

    @property
    def primary_metric(self) -> str:
        return str(self.summary.get("primary_metric", "accuracy"))

    @property
    def score(self) -> float:
        """Final-round mean of the primary metric (accuracy, or perplexity)."""
        return float(self.summary[self.primary_metric]["mean"])

    def curve(self, key: str | None = None) -> list[tuple[int, float]]:
        """(round, value) of a per-round figure, by default the primary metric's mean."""
        key = key or f"{self.primary_metric}_mean"
        return [(m["round"], m[key]) for m in self.metrics if key in m]


def as_config(config: Mapping[str, Any] | ExperimentConfig | str | Path,
              overrides: Iterable[str] = ()) -> ExperimentConfig:
    """A checked config from a mapping, a config object or a YAML file (plus `key=value`
    overrides); a bad one raises `ConfigError` with one line naming the key."""
    if isinstance(config, ExperimentConfig):
        raw = config.model_dump(mode="json")
    elif isinstance(config, str | Path):
        raw = load_raw(Path(config))
    else:
        raw = dict(config)
    return validate(apply_overrides(raw, list(overrides)))


def run(config: Mapping[str, Any] | ExperimentConfig | str | Path, out: str | Path | None = None,
        *, overrides: Iterable[str] = (), plugins: Iterable[str] = (), resume: bool = False,
        quiet: bool = True) -> Result:
    """Run one experiment (in a fresh temporary directory unless `out` is given)."""
    load_plugins(plugins)
    checked = as_config(config, overrides)
    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="fedflock-"))
    if isinstance(config, str | Path) and not resume:
        RunDirectory(folder).refuse_overwriting(Path(config))
    summary = run_experiment(checked, folder, resume=resume, quiet=quiet)
    return Result(summary, read_metrics(folder / "metrics.jsonl"), folder)
