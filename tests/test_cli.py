"""The command line: every user error is one line on stderr and exit status 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedflock.experiment import run_experiment
from fedflock.validation import validate
from tests.conftest import one_error_line, small_config


def fedflock(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedflock", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def _write(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


BAD_CONFIGS = {
    "unknown top-level key": ({"speed": 3}, "speed"),
    "negative lr": ({"training": {"lr": -0.1}}, "training.lr"),
    "groups > clients": ({"data": {"clients": 3, "scenario": {"kind": "rotation", "groups": 4}}},
                         "groups"),
    "unknown algorithm": ({"algorithm": {"name": "fedmagic"}}, "algorithm.name"),
    "unknown algorithm parameter": ({"algorithm": {"name": "cfl", "eps3": 1}}, "algorithm.eps3"),
    "eps rule without eps": ({"algorithm": {"name": "cfl", "split_rule": "eps"}}, "eps1"),
    "unknown dataset": ({"data": {"dataset": "imagenet"}}, "data.dataset"),
    "unknown model": ({"model": {"name": "resnet999"}}, "model.name"),
    "unknown scenario": ({"data": {"scenario": {"kind": "chaos"}}}, "data.scenario.kind"),
    "zero rounds": ({"rounds": 0}, "rounds"),
    "participation above 1": ({"participation": {"fraction": 1.5}}, "participation.fraction"),
    "unknown executor": ({"training": {"executor": "gpu-cluster"}}, "training.executor"),
    "momentum of 1": ({"training": {"momentum": 1.0}}, "training.momentum"),
    "unknown attack": ({"attack": {"kind": "meteor", "fraction": 0.2}}, "attack.kind"),
    "attack fraction 1": ({"attack": {"kind": "zero", "fraction": 1.0}}, "attack.fraction"),
    "label map outside classes": (
        {"attack": {"kind": "label_flip", "fraction": 0.2, "label_map": {0: 12}}},
        "attack.label_map"),
    "no benign client left": ({"attack": {"kind": "zero", "fraction": 0.99}}, "attack.fraction"),
    "participation count 0": ({"participation": {"count": 0}}, "participation.count"),
    "participation fraction and count": ({"participation": {"fraction": 0.1, "count": 5}},
                                         "config: participation: give fraction (0.1) or count"),
    "unknown similarity": ({"algorithm": {"name": "incremental", "similarity": "jaccard"}},
                           "algorithm.similarity"),
    "sketched manhattan": ({"algorithm": {"name": "incremental", "similarity": "manhattan",
                                          "sketch": 64}}, "sketch"),
    "trimmed mean beta 0.5": ({"algorithm": {"name": "trimmed_mean", "beta": 0.5}},
                              "algorithm.beta"),
    "infinite lr": ({"training": {"lr": float("inf")}}, "training.lr"),
    "NaN algorithm threshold": ({"algorithm": {"name": "cfl", "f_threshold": float("nan")}},
                                "algorithm.f_threshold"),
    "negative seed": ({"seed": -1}, "seed"),
    "zero hidden width": ({"model": {"hidden": [0]}}, "model.hidden"),
    "negative hidden width": ({"model": {"hidden": [100, -5]}}, "model.hidden"),
    "oracle clusters overlap": ({"algorithm": {"name": "oracle", "clusters": [[0, 1], [1]]}},
                                "algorithm.clusters"),
    "oracle clusters miss a client": (
        {"algorithm": {"name": "oracle", "clusters": [list(range(10)), list(range(10, 19))]}},
        "algorithm.clusters"),
    "samples beyond memory": ({"data": {"samples_per_client": 100_000_000}},
                              "data.samples_per_client"),
    "options of a built-in scenario": ({"data": {"scenario": {"kind": "rotation",
                                                              "options": {"angle": 30}}}},
                                       "config: data.scenario.options:"),
    "no local work": ({"training": {"local_epochs": None, "local_steps": None}},
                      "local_epochs"),
    "attack after the last round": (
        {"rounds": 5, "attack": {"kind": "zero", "fraction": 0.2, "start_round": 6}},
        "attack.start_round"),
    "data attack after the last round": (
        {"rounds": 5, "attack": {"kind": "label_flip", "fraction": 0.2, "start_round": 6}},
        "attack.start_round"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, case: str, cli) -> None:
    """In process: `main` is what the `fedflock` script runs (a few cases below go through a
    real interpreter too)."""
    raw, key = BAD_CONFIGS[case]
    one_error_line(*cli("run", str(_write(tmp_path / "c.yaml", raw)), "--out",
                        str(tmp_path / "o")), key)
    assert not (tmp_path / "o").exists()


def test_other_user_errors_exit_2(tmp_path: Path, cli) -> None:
    cases = [
        ("run", str(tmp_path / "missing.yaml")),
        ("run", str(_write(tmp_path / "bad.yaml", {}).with_name("x.yaml"))),
    ]
    (tmp_path / "broken.yaml").write_text("data: [unclosed\n")
    cases.append(("run", str(tmp_path / "broken.yaml")))
    good = _write(tmp_path / "good.yaml", small_config())
    cases.append(("run", str(good), "--set", "training.lr"))  # no '='
    cases.append(("run", str(good), "--set", "training.lr=-1"))
    cases.append(("run", str(good), "--out", str(tmp_path / "none"), "--resume"))
    cases.append(("compare", str(good), "--seeds", "a,b"))
    cases.append(("compare", str(good), "--seeds", ""))
    cases.append(("compare", str(good), "--seeds", "0,0"))
    cases.append(("compare", str(good), "--algorithms", ","))
    cases.append(("compare", str(good), "--algorithms", "fedavg,fedavg"))
    cases.append(("run", str(good), "--set", "=1"))
    cases.append(("run", str(good), "--set", "training..lr=1"))
    cases.append(("report", str(tmp_path / "no-such-run")))
    cases.append(("assign", str(tmp_path)))
    (tmp_path / "empty.yaml").write_text("# nothing here\n")
    cases.append(("run", str(tmp_path / "empty.yaml"), "--out", str(tmp_path / "e")))
    (tmp_path / "a-file").write_text("keep me")
    cases.append(("compare", str(good), "--out", str(tmp_path / "a-file")))
    for args in cases:
        one_error_line(*cli(*args))
    assert (tmp_path / "a-file").read_text() == "keep me"
    assert not (tmp_path / "e").exists()


def test_user_errors_from_a_real_process_exit_2(tmp_path: Path) -> None:
    """The same through the installed entry point: one line on stderr, exit status 2."""
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)))
    good = _write(tmp_path / "good.yaml", small_config())
    (tmp_path / "a-file").write_text("keep me")
    nodata = _write(tmp_path / "nodata.yaml",
                    {"data": {"dataset": "mnist", "root": str(tmp_path / "nowhere")}})
    for args in [("run", str(tmp_path / "binary.yaml"), "--out", str(tmp_path / "b")),
                 ("run", str(good), "--out", str(tmp_path / "a-file")),
                 ("run", str(nodata), "--out", str(tmp_path / "nd"))]:
        result = fedflock(*args)
        one_error_line(result.returncode, result.stderr)
    assert (tmp_path / "a-file").read_text() == "keep me"
    assert not (tmp_path / "b").exists()


def test_missing_data_file_names_the_file_and_where(tmp_path: Path) -> None:
    cfg = _write(tmp_path / "c.yaml", {"data": {"dataset": "mnist", "root": str(tmp_path)}})
    result = fedflock("run", str(cfg), "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert "train-images-idx3-ubyte" in result.stderr and str(tmp_path) in result.stderr


def test_run_set_overrides_and_writes_the_run_directory(tmp_path: Path) -> None:
    cfg = _write(tmp_path / "c.yaml", small_config())
    out = tmp_path / "run"
    result = fedflock("run", str(cfg), "--set", "rounds=2", "--set", "algorithm.name=local",
                      "--out", str(out), "-q")
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["algorithm"] == "local"
    assert yaml.safe_load((out / "config.yaml").read_text())["rounds"] == 2
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert (out / "checkpoints" / "last.pt").is_file()


def test_compare_prints_a_table_and_writes_results(tmp_path: Path) -> None:
    cfg = _write(tmp_path / "c.yaml", small_config())
    out = tmp_path / "cmp"
    result = fedflock("compare", str(cfg), "--algorithms", "fedavg,local", "--seeds", "0,1",
                      "--out", str(out), "-q")
    assert result.returncode == 0, result.stderr
    assert "fedavg" in result.stdout and "local" in result.stdout
    rows = json.loads((out / "compare.json").read_text())["rows"]
    assert [r["algorithm"] for r in rows] == ["fedavg", "local"]
    assert len(rows[0]["accuracy"]["per_seed"]) == 2
    assert (out / "local" / "seed1" / "summary.json").is_file()


def test_compare_runs_the_configs_own_seed_unless_told_otherwise(tmp_path: Path) -> None:
    cfg = _write(tmp_path / "c.yaml", small_config(seed=3, rounds=1))
    out = tmp_path / "cmp"
    done = fedflock("compare", str(cfg), "--algorithms", "fedavg", "--out", str(out), "-q")
    assert done.returncode == 0, done.stderr
    assert [p.name for p in (out / "fedavg").iterdir() if p.is_dir()] == ["seed3"]
    assert json.loads((out / "fedavg" / "seed3" / "summary.json").read_text())["seed"] == 3


def test_a_plugin_that_raises_as_it_imports_is_one_error_line(tmp_path: Path, cli) -> None:
    plugin = tmp_path / "broken_plugin.py"
    plugin.write_text("raise RuntimeError('the lab server is down')\n")
    one_error_line(*cli("--plugin", str(plugin), "list"), "broken_plugin.py", "RuntimeError",
                   "the lab server is down")
    assert "fedflock_plugin_broken_plugin" not in sys.modules


def test_list_names_every_registered_component() -> None:
    result = fedflock("list")
    assert result.returncode == 0
    for name in ("mnist5k", "label_permutation", "cnn_bn", "cfl", "fedavg_ft", "processes",
                 "incremental", "multi_krum", "sign_flip", "label_flip", "manhattan"):
        assert name in result.stdout
    for name in ("ifca", "select", "basis", "next_token"):  # algorithms, tasks, objectives
        assert name in result.stdout


def test_list_params_prints_types_defaults_and_descriptions() -> None:
    result = fedflock("list", "--params", "cfl")
    assert result.returncode == 0
    line = next(ln for ln in result.stdout.splitlines() if ln.split()[:1] == ["f_threshold"])
    assert "float" in line and "3.5" in line and "pseudo-F" in line
    assert "one of auto|eps" in result.stdout
    sketch = next(ln for ln in fedflock("list", "--params", "incremental").stdout.splitlines()
                  if ln.split()[:1] == ["sketch"])
    assert "int | auto | None" in sketch and "Union" not in sketch
    unknown = fedflock("list", "--params", "nope")
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1


def test_assign_prints_where_each_new_client_went(tmp_path: Path, capsys, monkeypatch) -> None:
    from fedflock.cli import main

    run_experiment(validate(small_config(algorithm={"name": "fedavg_ft"})), tmp_path / "r",
                   quiet=True)
    monkeypatch.setattr(sys, "argv", ["fedflock", "assign", str(tmp_path / "r"),
                                      "--clients", "3"])
    main()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4
    assert all(re.search(r"-> cluster 0 \(serves group \d\), accuracy \d\.\d{3}$", line)
               for line in out[:3]), out
    assert out[3].startswith("placed in its own group's cluster:") and "mean accuracy" in out[3]
    assert json.loads((tmp_path / "r" / "assign.json").read_text())["finetune_epochs"] == 3


def test_an_interrupted_command_exits_130_not_0(monkeypatch, capsys) -> None:
    """click returns 130 on Ctrl-C in non-standalone mode instead of raising; `main` must pass
    it on, so `fedflock run ... && next` stops."""
    import fedflock.cli as cli_module

    monkeypatch.setattr(cli_module, "app", lambda standalone_mode: 130)
    with pytest.raises(SystemExit) as done:
        cli_module.main()
    assert done.value.code == 130 and capsys.readouterr().err == "error: interrupted\n"


def test_run_refuses_to_overwrite_the_config_it_runs(tmp_path: Path, cli) -> None:
    folder = tmp_path / "exp"
    folder.mkdir()
    cfg = _write(folder / "config.yaml", small_config())
    written = cfg.read_text()
    one_error_line(*cli("run", str(cfg), "--out", str(folder), "-q"),
                   "its config.yaml is the config being run")
    assert cfg.read_text() == written and not (folder / "metrics.jsonl").exists()
    from fedflock import api
    from fedflock.errors import FedflockError

    with pytest.raises(FedflockError, match="the config being run"):
        api.run(cfg, folder)
    assert cfg.read_text() == written


def test_a_registered_docstring_is_described_by_its_first_sentence() -> None:
    from fedflock.registry import Registry, first_sentence

    class Probe:
        """Scores K models on the client's data, picks one
        and trains it. Details follow here.

        More paragraphs."""

    registry: Registry[type] = Registry("thing")
    registry.register("probe")(Probe)
    assert registry.describe() == {"probe": "Scores K models on the client's data, picks one "
                                   "and trains it."}
    assert first_sentence("No full stop\nacross lines\n\nnext") == "No full stop across lines"
