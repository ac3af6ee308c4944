"""The Python API and plugins: an experiment from a dict, and a method defined in the user's own
file (examples/custom_algorithm.py) picked up by the API and by the CLI."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedflock.algorithms import ALGORITHMS
from fedflock.api import Result, run
from fedflock.errors import ConfigError, FedflockError
from fedflock.plugins import load_plugins
from fedflock.wire import TASKS
from tests.conftest import REPO, small_config

EXAMPLE = str(REPO / "examples" / "custom_algorithm.py")


def test_run_from_a_dict_returns_summary_and_per_round_metrics(tmp_path: Path) -> None:
    result = run(small_config(), tmp_path / "run")
    assert isinstance(result, Result)
    assert result.summary["algorithm"] == "fedavg" and result.primary_metric == "accuracy"
    assert [m["round"] for m in result.metrics] == [1, 2, 3]
    assert result.score == result.summary["accuracy"]["mean"] == result.curve()[-1][1]
    assert (tmp_path / "run" / "summary.json").is_file()


def test_a_bad_config_is_one_error_line() -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.name"):
        run(small_config(**{"algorithm.name": "nope"}))


def test_an_unknown_plugin_is_one_error_line() -> None:
    with pytest.raises(FedflockError, match="plugin"):
        load_plugins(["no_such_fedflock_plugin"])


def test_the_example_plugin_registers_a_method_and_a_task(tmp_path: Path) -> None:
    result = run(small_config(**{"algorithm": {"name": "example_fedprox", "mu": 0.5}}),
                 tmp_path / "prox", plugins=[EXAMPLE])
    assert "example_fedprox" in ALGORITHMS and "update_norm" in TASKS
    plain = run(small_config(), tmp_path / "plain")
    # the proximal term changes training: same seed, different final accuracy or loss
    assert result.metrics[-1]["train_loss"] != plain.metrics[-1]["train_loss"]
    from fedflock.client.runtime import ClientRuntime
    from fedflock.data.scenarios import build_federated_data
    from fedflock.validation import validate

    cfg = validate(small_config())
    runtime = ClientRuntime(build_federated_data(cfg.data, 0), cfg.model, cfg.training, 0)
    norm = TASKS.get("update_norm")(0, 1, runtime.initial_params()).run(runtime)
    assert norm.metrics["norm"] > 0 and not norm.tensors
    load_plugins([EXAMPLE])  # loading twice is harmless


def test_the_cli_loads_a_plugin_for_list_and_run(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "fedflock.cli", "--plugin", EXAMPLE]
    listed = subprocess.run([*cli, "list", "--params", "example_fedprox"], capture_output=True,
                            text=True, cwd=tmp_path, check=True)
    assert "mu" in listed.stdout and "proximal" in listed.stdout
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(small_config(**{"algorithm.name": "example_fedprox"})))
    done = subprocess.run([*cli, "run", str(config), "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["algorithm"] == "example_fedprox"
    assert torch.tensor(summary["accuracy"]["per_client"]).numel() == 6


def test_a_plugin_imported_by_name_is_found_by_other_processes(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """A module found on a path added here (the current folder, say) is not on a Flower
    process's path: its folder is what those processes need, for a package's module too, and for
a symlink the folder of its name (its target's folder does not hold that name)."""
    from fedflock import plugins

    monkeypatch.setattr(plugins, "_named", [])  # loaded for this test only
    monkeypatch.setattr(plugins, "_loaded", {})
    package = tmp_path / "lab" / "team_plugins"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "noop_method.py").write_text("MARK = 1\n")
    (tmp_path / "lab" / "single_plugin.py").write_text("MARK = 2\n")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "kept_elsewhere.py").write_text("MARK = 3\n")
    (tmp_path / "lab" / "linked_plugin.py").symlink_to(tmp_path / "store" / "kept_elsewhere.py")
    monkeypatch.syspath_prepend(str(tmp_path / "lab"))
    load_plugins(["team_plugins.noop_method", "single_plugin", "linked_plugin"])
    assert plugins.plugin_search_path() == [str((tmp_path / "lab").resolve())]


def test_overrides_leave_the_callers_mapping_alone() -> None:
    from fedflock.api import as_config

    raw = small_config()
    before = copy.deepcopy(raw)
    assert as_config(raw, overrides=["data.clients=4"]).data.clients == 4
    assert raw == before
