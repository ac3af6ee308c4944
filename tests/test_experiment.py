"""Determinism, checkpoints and resume (including a killed run), run-directory contract."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from fedflock.algorithms import ALGORITHMS
from fedflock.config import ParticipationConfig, dump_config
from fedflock.errors import FedflockError
from fedflock.experiment import run_experiment, sample_clients, without_timings
from fedflock.validation import resolved, validate
from tests.conftest import make_algorithm, small_config

CFL = {"name": "cfl", "warmup_rounds": 2, "patience": 2}


def test_same_seed_gives_identical_summary(tmp_path: Path) -> None:
    raw = small_config(algorithm=CFL, rounds=10, **{"data.clients": 8})
    a = run_experiment(validate(raw), tmp_path / "a", quiet=True)
    b = run_experiment(validate(raw), tmp_path / "b", quiet=True)
    assert without_timings(a) == without_timings(b)
    c = run_experiment(validate({**raw, "seed": 1}), tmp_path / "c", quiet=True)
    assert without_timings(c) != without_timings(a)


def test_resume_from_a_checkpoint_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    raw = small_config(algorithm=CFL, rounds=10, checkpoint_every=3, **{"data.clients": 8})
    full = run_experiment(validate(raw), tmp_path / "full", quiet=True)
    # Stop after 6 rounds (as if interrupted), then continue to 10 with --resume.
    short = run_experiment(validate({**raw, "rounds": 6}), tmp_path / "part", quiet=True)
    assert short["rounds"] == 6
    config_path = tmp_path / "part" / "config.yaml"
    config_path.write_text(yaml.safe_dump({**yaml.safe_load(config_path.read_text()),
                                           "rounds": 10}, sort_keys=False))
    resumed = run_experiment(validate(raw), tmp_path / "part", resume=True, quiet=True)
    assert without_timings(resumed) == without_timings(full)
    lines = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == list(range(1, 11))


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedflock", *args]


def test_killed_run_resumes_to_the_same_summary(tmp_path: Path) -> None:
    raw = small_config(algorithm=CFL, rounds=60, checkpoint_every=2,
                       **{"data.clients": 8, "data.samples_per_client": 100,
                          "training.local_epochs": 2})
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "killed"
    env = {**os.environ, "FEDFLOCK_QUIET": "1"}
    proc = subprocess.Popen(_cli("run", str(config), "--out", str(out)), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 7:
            break
        if proc.poll() is not None:
            pytest.fail(f"run ended before it could be killed: {proc.stderr.read().decode()}")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists(), "the run must have been interrupted"
    done = subprocess.run(_cli("run", str(config), "--out", str(out), "--resume"), env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    resumed = json.loads((out / "summary.json").read_text())
    full = run_experiment(validate(raw), tmp_path / "full", quiet=True)
    assert without_timings(resumed) == without_timings(full)


def test_a_finished_run_directory_is_never_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_experiment(validate(small_config()), out, quiet=True)
    before = (out / "summary.json").read_text()
    with pytest.raises(FedflockError, match="already holds a run"):
        run_experiment(validate(small_config()), out, quiet=True)
    assert (out / "summary.json").read_text() == before


def test_resume_refuses_a_changed_config(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_experiment(validate(small_config()), out, quiet=True)
    with pytest.raises(FedflockError, match=r"config differs .*\(training\.lr: [\d.]+ there, "
                                            r"0\.05 here\); resume with the same config"):
        run_experiment(validate(small_config(**{"training.lr": 0.05})), out, resume=True)


def test_config_yaml_spells_out_every_algorithm_parameter(tmp_path: Path) -> None:
    """What the run used, defaults included, so the record outlives a change of default."""
    out = tmp_path / "run"
    run_experiment(validate(small_config(algorithm=CFL)), out, quiet=True)
    stored = yaml.safe_load((out / "config.yaml").read_text())["algorithm"]
    defaults = ALGORITHMS.get("cfl").Params().model_dump(mode="json")
    assert stored == {**defaults, **CFL}
    assert stored["f_threshold"] == defaults["f_threshold"] and len(stored) > len(CFL)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_resolved_config_validates_back_to_itself(name: str) -> None:
    """The written config.yaml, read back as it stands, is the run's settings: every parameter
    is there (none filled in again by a default on reading) and each keeps its value."""
    config = resolved(validate(small_config(algorithm={"name": name})))
    written = yaml.safe_load(dump_config(config))
    params = ALGORITHMS.get(name).Params.model_fields
    assert set(written["algorithm"]) == {"name", *params}
    assert validate(written) == config


def test_resume_compares_settings_not_the_written_form(tmp_path: Path) -> None:
    """A config.yaml holding only the parameters given (as written before every default was
    spelled out) resumes; a changed value is still refused."""
    raw = small_config(algorithm=CFL, rounds=4, checkpoint_every=2)
    run_experiment(validate({**raw, "rounds": 2}), tmp_path / "run", quiet=True)
    path = tmp_path / "run" / "config.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(dump_config(validate(raw))),
                                    "rounds": 4}))
    assert yaml.safe_load(path.read_text())["algorithm"] == CFL
    changed = {**raw, "algorithm": {**CFL, "f_threshold": 2.0}}
    with pytest.raises(FedflockError, match="config differs"):
        run_experiment(validate(changed), tmp_path / "run", resume=True, quiet=True)
    with pytest.warns(UserWarning, match="today's defaults"):
        resumed = run_experiment(validate(raw), tmp_path / "run", resume=True, quiet=True)
    assert resumed["rounds"] == 4


def test_participation_sampling_is_seeded_and_sized() -> None:
    tenth = ParticipationConfig(fraction=0.1)
    a = sample_clients(100, tenth, seed=0, rnd=3)
    assert a == sample_clients(100, tenth, seed=0, rnd=3)
    assert a != sample_clients(100, tenth, seed=0, rnd=4)
    assert len(a) == 10 and len(set(a)) == 10
    assert sample_clients(5, ParticipationConfig(), 0, 1) == [0, 1, 2, 3, 4]
    assert len(sample_clients(1000, ParticipationConfig(count=7), 0, 1)) == 7
    # a tiny fraction still samples one client per round
    assert len(sample_clients(100, ParticipationConfig(fraction=0.001), 0, 1)) == 1


def test_final_tasks_stop_when_nobody_answers() -> None:
    """Fine-tuning (or placing) clients that never reply is asked once, not in a loop."""
    from fedflock.engines.base import Engine

    class Silent(Engine):
        name = "silent"
        num_clients, update_size, true_groups, executor_name = 3, 2, None, "none"
        data_spec = None
        calls = 0

        def initial_models(self, count):
            return torch.zeros(count, 2)

        def model_handle(self):
            return None

        def run_tasks(self, rnd, tasks):
            Silent.calls += 1
            return []

    algorithm = make_algorithm("fedavg_ft", 3, 2)
    engine = Silent()
    assert engine.finish(algorithm, 5, [0, 1, 2]) is True
    assert Silent.calls == 1 and engine.missing == {0: [5], 1: [5], 2: [5]}


def test_an_unanswered_last_evaluation_is_marked_not_passed_off_as_final(tmp_path: Path) -> None:
    """When nobody answers the last round's evaluation (nodes down), summary.json and the
    round's record say which round their figures come from."""
    from fedflock.engines.embedded import EmbeddedEngine
    from fedflock.experiment import Run

    class LastRoundSilent(EmbeddedEngine):
        def evaluate(self, algorithm, rnd=0):
            return {} if rnd == 3 else super().evaluate(algorithm, rnd)

    config = validate(small_config(rounds=3))
    summary = Run(config, tmp_path / "run", quiet=True).execute(
        engine=LastRoundSilent.from_config(config))
    assert summary["evaluated_round"] == 2
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["round"] == 3 and last["evaluated_round"] == 2
    whole = run_experiment(config, tmp_path / "whole", quiet=True)
    assert "evaluated_round" not in whole


def test_a_run_nobody_evaluated_ends_in_one_error_with_its_records_kept(tmp_path: Path) -> None:
    """No figures at all (every evaluation unanswered) is an error, not a summary of nothing;
    the rounds' records stay on disk."""
    from fedflock.engines.embedded import EmbeddedEngine
    from fedflock.experiment import Run

    class NeverEvaluated(EmbeddedEngine):
        def evaluate(self, algorithm, rnd=0):
            return {}

    config = validate(small_config(rounds=2))
    with pytest.raises(FedflockError, match="no client answered an evaluation in 2 rounds"):
        Run(config, tmp_path / "run", quiet=True).execute(
            engine=NeverEvaluated.from_config(config))
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2
    assert not (tmp_path / "run" / "summary.json").exists()


def test_figures_from_before_the_final_tasks_are_marked(tmp_path: Path) -> None:
    """fedavg_ft's clients fine-tune after the last round; if nobody answers the evaluation
    after that, summary.json says its figures predate the fine-tuning."""
    from fedflock.engines.embedded import EmbeddedEngine
    from fedflock.experiment import Run

    class SilentAfterFinish(EmbeddedEngine):
        def finish(self, algorithm, rnd, clients):
            self.finished = True
            return super().finish(algorithm, rnd, clients)

        def evaluate(self, algorithm, rnd=0):
            return {} if getattr(self, "finished", False) else super().evaluate(algorithm, rnd)

    config = validate(small_config(rounds=2, algorithm={"name": "fedavg_ft"}))
    summary = Run(config, tmp_path / "run", quiet=True).execute(
        engine=SilentAfterFinish.from_config(config))
    assert summary["evaluated_before_final_tasks"] is True
    assert "evaluated_before_final_tasks" not in run_experiment(config, tmp_path / "whole",
                                                                quiet=True)


def test_compare_resume_continues_what_is_there_and_checks_every_folder_first(
        tmp_path: Path) -> None:
    from fedflock.compare import compare

    config, out = validate(small_config()), tmp_path / "cmp"
    compare(config, ["fedavg"], [0, 1], out, quiet=True)
    done = {s: (out / "fedavg" / f"seed{s}" / "metrics.jsonl").read_text() for s in (0, 1)}
    (out / "fedavg" / "seed1" / "summary.json").unlink()  # seed 1 was interrupted
    with pytest.raises(FedflockError, match="already holds a run; use --resume"):
        compare(config, ["fedavg", "local"], [0, 1], out, quiet=True)
    assert not (out / "local").exists()  # refused before any run started
    changed = validate(small_config(rounds=4))
    with pytest.raises(FedflockError, match="rounds: 3 there, 4 here"):
        compare(changed, ["local", "fedavg"], [0, 1], out, quiet=True, resume=True)
    assert not (out / "local").exists()
    rows = compare(config, ["fedavg", "local"], [0, 1], out, quiet=True, resume=True)
    assert [r["algorithm"] for r in rows] == ["fedavg", "local"]
    assert (out / "fedavg" / "seed1" / "summary.json").is_file()
    assert (out / "local" / "seed1" / "summary.json").is_file()
    for seed in (0, 1):  # nothing re-run: the logged rounds are the first compare's
        assert (out / "fedavg" / f"seed{seed}" / "metrics.jsonl").read_text() == done[seed]


def test_flower_engine_refuses_a_used_run_directory_before_starting_flower(
        tmp_path: Path) -> None:
    out = tmp_path / "r"
    run_experiment(validate(small_config()), out, quiet=True)
    started = time.perf_counter()
    with pytest.raises(FedflockError, match="already holds a run"):
        run_experiment(validate(small_config(engine="flower")), out, quiet=True)
    assert time.perf_counter() - started < 5  # Flower's start-up alone takes ~20 s
    assert not (tmp_path / "r.flower.log").exists()


def test_compare_keeps_the_configs_algorithm_parameters_and_runs_the_others_on_defaults(
        tmp_path: Path) -> None:
    from fedflock.compare import compare

    config = validate(small_config(rounds=1, algorithm={"name": "fedavg_ft",
                                                        "finetune_epochs": 1}))
    compare(config, ["fedavg_ft", "fedavg"], [0], tmp_path, quiet=True)
    written = {name: yaml.safe_load((tmp_path / name / "seed0" / "config.yaml").read_text())
               for name in ("fedavg_ft", "fedavg")}
    assert written["fedavg_ft"]["algorithm"]["finetune_epochs"] == 1  # the default is 3
    assert "finetune_epochs" not in written["fedavg"]["algorithm"]
