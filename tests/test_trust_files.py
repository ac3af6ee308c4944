"""Files fedflock reads never run code; damaged run directories are reported in one line;
resume survives a torn metrics line, a run killed before its first checkpoint, and keeps the
refused replies; two runs never write one directory."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fedflock.data import datasets as D
from fedflock.engines.embedded import EmbeddedEngine
from fedflock.errors import DataError, FedflockError
from fedflock.experiment import Run, run_experiment, without_timings
from fedflock.fileio import atomic_open, json_text
from fedflock.rundir import RunDirectory
from fedflock.validation import validate
from tests.conftest import one_error_line, small_config

CFL = {"name": "cfl", "warmup_rounds": 2, "patience": 2}


class Payload:
    """Unpickling this object creates `marker`: proof that a loader ran code from a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def fedflock(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedflock", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def finished_cfl(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished CFL run (config file, run directory) with a parameter tree."""
    root = tmp_path_factory.mktemp("cfl")
    raw = small_config(algorithm=CFL, rounds=6, **{"data.clients": 8})
    config = root / "c.yaml"
    config.write_text(yaml.safe_dump(raw))
    run_experiment(validate(raw), root / "run", quiet=True)
    return config, root / "run"


def _copy_run(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    return dst


# -- 1. no code from files ----------------------------------------------------------------------

def test_crafted_checkpoint_is_refused_by_resume_and_assign(tmp_path: Path,
                                                            finished_cfl: tuple[Path, Path],
                                                            cli) -> None:
    config, src = finished_cfl
    run = _copy_run(src, tmp_path / "shared-run")
    marker = tmp_path / "pwned"
    torch.save({"format": 2, "round": 1, "algorithm_name": "cfl",
                "algorithm": {"decisions": [Payload(marker)]}}, run / "checkpoints" / "last.pt")
    result = fedflock("run", str(config), "--out", str(run), "--resume")  # a real process
    one_error_line(result.returncode, result.stderr, "last.pt", "refused")
    one_error_line(*cli("assign", str(run), "--clients", "2"), "last.pt", "refused")
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["empty", "truncated", "not a zip", "wrong algorithm",
                                    "not a mapping", "old format"])
def test_damaged_checkpoint_is_one_line_naming_the_file(tmp_path: Path, damage: str,
                                                        finished_cfl: tuple[Path, Path]
                                                        ) -> None:
    _, src = finished_cfl
    run = _copy_run(src, tmp_path / "run")
    path = run / "checkpoints" / "last.pt"
    good = path.read_bytes()
    state = torch.load(path, weights_only=True)
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "not a zip":
        path.write_text("hello")
    elif damage == "wrong algorithm":
        torch.save({**state, "algorithm_name": "fedavg"}, path)
    elif damage == "not a mapping":
        torch.save([1, 2, 3], path)
    else:
        torch.save({k: v for k, v in state.items() if k != "format"}, path)
    with pytest.raises(FedflockError) as err:
        RunDirectory(run).read_checkpoint("cfl")
    message = str(err.value)
    assert str(path) in message and "\n" not in message


def test_damaged_checkpoint_from_the_command_line_exits_2(tmp_path: Path,
                                                          finished_cfl: tuple[Path, Path],
                                                          cli) -> None:
    config, src = finished_cfl
    run = _copy_run(src, tmp_path / "run")
    (run / "checkpoints" / "last.pt").write_bytes(b"")  # was: exit 130 with a blank line
    one_error_line(*cli("run", str(config), "--out", str(run), "--resume"), "last.pt")


def test_checkpoint_that_does_not_fit_the_algorithm_is_one_line(
        tmp_path: Path, finished_cfl: tuple[Path, Path], cli) -> None:
    config, src = finished_cfl
    run = _copy_run(src, tmp_path / "run")
    path = run / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    torch.save({**state, "algorithm": {"decisions": []}}, path)  # right name, wrong content
    one_error_line(*cli("run", str(config), "--out", str(run), "--resume"), "last.pt")


def _cifar_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8),
                 b"labels": [1, 2]}
        (folder / name).write_bytes(pickle.dumps(batch))
    return folder


def test_crafted_cifar_batch_does_not_run_code(tmp_path: Path) -> None:
    folder = _cifar_folder(tmp_path)
    marker = tmp_path / "pwned"
    (folder / "data_batch_3").write_bytes(pickle.dumps({b"data": Payload(marker),
                                                        b"labels": [1]}))
    with pytest.raises(DataError) as err:
        D.load_cifar10.__wrapped__(tmp_path)
    assert "data_batch_3" in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("batch", [
    [1, 2, 3],  # not a dict
    {b"data": "text", b"labels": [1]},
    {b"data": np.zeros((1, 3072), dtype=np.float64), b"labels": [1]},
    {b"data": np.zeros((1, 3072), dtype=np.uint8), b"labels": ["cat"]},
    {b"data": np.zeros((1, 3072), dtype=np.uint8), b"labels": [1, 2]},
    {b"labels": [1]},
])
def test_cifar_batch_of_wrong_types_is_a_data_error(tmp_path: Path, batch: object) -> None:
    folder = _cifar_folder(tmp_path)
    (folder / "test_batch").write_bytes(pickle.dumps(batch))
    with pytest.raises(DataError) as err:
        D.load_cifar10.__wrapped__(tmp_path)
    assert "test_batch" in str(err.value) and "\n" not in str(err.value)


def test_crafted_dataset_cache_is_rebuilt_without_running_code(
        shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoded-dataset cache lives in the user's home: a crafted cache file is refused
    unread (weights_only) and decoded afresh."""
    monkeypatch.setenv("FEDFLOCK_CACHE", str(tmp_path / "cache"))
    first = D.load_femnist.__wrapped__(shared_data)
    (cache,) = (tmp_path / "cache").glob("femnist-*.pt")
    marker = tmp_path / "pwned"
    torch.save({"xtr": Payload(marker)}, cache)
    again = D.load_femnist.__wrapped__(shared_data)
    assert torch.equal(first.x_train, again.x_train)
    assert not marker.exists()


def test_crafted_npz_with_objects_is_a_data_error(tmp_path: Path) -> None:
    """FEMNIST's npz is read with allow_pickle=False: an object array is refused unread."""
    folder = tmp_path / "femnist_leaf"
    folder.mkdir()
    marker = tmp_path / "pwned"
    arrays = {k: np.zeros((1, 28, 28), dtype=np.uint8) for k in ("x_train", "x_test")}
    arrays |= {k: np.zeros(1, dtype=np.int64) for k in ("y_train", "y_test", "writer_test")}
    arrays["writer_train"] = np.array([Payload(marker)], dtype=object)
    np.savez(folder / "femnist_leaf_niid05.npz", **arrays)
    with pytest.raises(DataError) as err:
        D.load_femnist.__wrapped__(tmp_path)
    assert "femnist_leaf_niid05.npz" in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


# -- 3. nothing lost ---------------------------------------------------------------------------

def _extend_rounds(run: Path, rounds: int) -> None:
    path = run / "config.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "rounds": rounds},
                                   sort_keys=False))


def test_resume_drops_a_torn_metrics_line(tmp_path: Path) -> None:
    raw = small_config(algorithm=CFL, rounds=6, checkpoint_every=2, **{"data.clients": 8})
    full = run_experiment(validate(raw), tmp_path / "full", quiet=True)
    run_experiment(validate({**raw, "rounds": 4}), tmp_path / "part", quiet=True)
    metrics = tmp_path / "part" / "metrics.jsonl"
    with metrics.open("a") as fh:
        fh.write('{"round": 5, "accuracy_me')  # a kill in the middle of a write
    _extend_rounds(tmp_path / "part", 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = run_experiment(validate(raw), tmp_path / "part", resume=True, quiet=True)
    assert any("unreadable" in str(w.message) for w in caught)
    assert without_timings(resumed) == without_timings(full)
    rounds = [json.loads(line)["round"] for line in metrics.read_text().splitlines()]
    assert rounds == list(range(1, 7))


def _killed_before_first_checkpoint(tmp_path: Path, raw: dict) -> Path:
    out = tmp_path / "killed"
    run_experiment(validate({**raw, "rounds": 2}), out, quiet=True)
    (out / "summary.json").unlink()
    for file in (out / "checkpoints").iterdir():
        file.unlink()
    _extend_rounds(out, raw["rounds"])
    return out


@pytest.mark.parametrize("resume", [True, False])
def test_run_killed_before_its_first_checkpoint_restarts(tmp_path: Path, resume: bool) -> None:
    raw = small_config(algorithm=CFL, rounds=4, checkpoint_every=10)
    full = run_experiment(validate(raw), tmp_path / "full", quiet=True)
    out = _killed_before_first_checkpoint(tmp_path, raw)
    with pytest.warns(UserWarning, match="checkpoint"):
        again = run_experiment(validate(raw), out, resume=resume, quiet=True)
    assert without_timings(again) == without_timings(full)
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4


def test_plain_run_over_a_run_with_a_checkpoint_is_refused(tmp_path: Path) -> None:
    raw = small_config(rounds=2)
    run_experiment(validate(raw), tmp_path / "run", quiet=True)
    (tmp_path / "run" / "summary.json").unlink()
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(FedflockError, match="already holds a run"):
        run_experiment(validate(raw), tmp_path / "run", quiet=True)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before


class NaNFromClient1(EmbeddedEngine):
    """Client 1 sends a NaN update in every even round (refused by the server)."""

    def run_tasks(self, rnd, tasks):
        replies = super().run_tasks(rnd, tasks)
        return [r.with_tensors(update=torch.full_like(r.update, float("nan")))
                if r.client == 1 and rnd % 2 == 0 and "update" in r.tensors else r
                for r in replies]


def test_refused_replies_survive_resume(tmp_path: Path) -> None:
    raw = small_config(rounds=6, checkpoint_every=2, **{"participation.fraction": 0.5})
    cfg = validate(raw)
    full = Run(cfg, tmp_path / "full", quiet=True).execute(
        engine=NaNFromClient1.from_config(cfg))
    assert [r["round"] for r in full["rejected_replies"] if r["client"] == 1]
    short = validate({**raw, "rounds": 4})
    Run(short, tmp_path / "part", quiet=True).execute(engine=NaNFromClient1.from_config(short))
    _extend_rounds(tmp_path / "part", 6)
    resumed = Run(cfg, tmp_path / "part", quiet=True).execute(
        resume=True, engine=NaNFromClient1.from_config(cfg))
    assert resumed["rejected_replies"] == full["rejected_replies"]
    assert resumed["missing_rounds"] == full["missing_rounds"]


def test_two_runs_never_write_one_directory(tmp_path: Path) -> None:
    raw = small_config(rounds=2)
    with RunDirectory(tmp_path / "run").locked(), \
            pytest.raises(FedflockError, match="in use by another fedflock run"):
        run_experiment(validate(raw), tmp_path / "run", quiet=True)
    run_experiment(validate(raw), tmp_path / "run", quiet=True)  # free again


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text('{"old": true}')
    with pytest.raises(RuntimeError), atomic_open(path) as fh:
        fh.write('{"new": ')
        raise RuntimeError("disk full")
    assert path.read_text() == '{"old": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_records_are_strict_json() -> None:
    text = json_text({"loss": float("nan"), "ppl": float("inf"), "x": [1.0, float("-inf")]})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(c)) == {
        "loss": None, "ppl": None, "x": [1.0, None]}


def test_a_diverging_run_writes_strict_json(tmp_path: Path) -> None:
    """Updates that overflow are refused, a diverged model's loss is written as null: every
    line of metrics.jsonl and summary.json is strict JSON (no bare NaN or Infinity)."""
    raw = small_config(rounds=3, **{"training.lr": 1e30, "server.norm_bound": None})
    run_experiment(validate(raw), tmp_path / "run", quiet=True)

    def strict(text: str) -> object:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c}"))

    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        strict(line)
    summary = strict((tmp_path / "run" / "summary.json").read_text())
    assert summary["rejected_replies"], "lr 1e30 must produce replies the server refuses"
