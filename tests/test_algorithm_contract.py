"""The contract every registered algorithm keeps, checked on each of them (plugins included)
over a small real federation: a checkpoint round trip resumes identically, the partition covers
every client exactly once, round diagnostics are JSON, and partial participation with a client
that never replies works, and a state holds exactly its declared keys."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import torch

from fedflock.algorithms import ALGORITHMS
from fedflock.engines.embedded import EmbeddedEngine
from fedflock.experiment import build_algorithm, round_clients, run_experiment
from fedflock.rundir import storable
from fedflock.validation import validate
from fedflock.wire import Reply, Task
from tests.conftest import one_error_line, small_config

# Settings that make each method change its structure within a few rounds.
QUICK = {"cfl": {"warmup_rounds": 0, "patience": 1, "f_threshold": 1.2, "min_replies": 3},
         "incremental": {"cluster_round": 2, "placement_delay": 0},
         "ifca": {"clusters": 2},
         "flhc": {"warmup_rounds": 1},
         "distfl": {"warmup_rounds": 2, "recluster_every": 2, "synthetic": 16, "steps": 5,
                    "threshold": 0.05}}
MODEL = {"distfl": {"name": "cnn_bn"}}  # methods that need a particular kind of model


class SilentClient(EmbeddedEngine):
    """The embedded engine, except that one client never answers."""

    silent = 0

    def run_tasks(self, rnd: int, tasks: list[Task]) -> list[Reply]:
        return [r for r in super().run_tasks(rnd, tasks) if r.client != self.silent]


def _setup(name: str, fraction: float = 1.0, engine_cls: type = EmbeddedEngine):
    raw = small_config(**{"data.clients": 8, "algorithm": {"name": name, **QUICK.get(name, {})},
                          "participation.fraction": fraction},
                       **({"model": MODEL[name]} if name in MODEL else {}))
    config = validate(raw)
    engine = engine_cls.from_config(config)
    return config, engine, build_algorithm(config, engine)


def _play(config, engine, algorithm, rounds: range) -> list[dict]:
    out = []
    for rnd in rounds:
        clients = round_clients(algorithm, engine.num_clients, config, rnd)
        diagnostics, _, _ = engine.train_round(algorithm, rnd, clients)
        out.append(diagnostics)
    return out


def _covers_everyone_once(algorithm, n: int) -> None:
    members = [c for part in algorithm.clusters() for c in part]
    assert sorted(members) == list(range(n)), algorithm.clusters()


def _through_a_checkpoint_file(state: dict) -> dict:
    """The state as a resumed run reads it: saved and loaded as `RunDir` does, so it shares
    no object with the live algorithm (a resume test on the live dict would miss mutable
    state the two runs share) and must hold only what a checkpoint can store."""
    buffer = io.BytesIO()
    torch.save(storable(state), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_checkpoint_round_trip_holds_the_declared_state_and_resumes_identically(
        name: str) -> None:
    config, engine, algorithm = _setup(name)
    try:
        _play(config, engine, algorithm, range(1, 3))
        state = _through_a_checkpoint_file(algorithm.state_dict())
        assert set(state) == type(algorithm).state_keys()
        last = sorted(state)[-1]
        short = {k: v for k, v in state.items() if k != last}
        for broken, error in ((short, f"missing ['{last}']"),
                              ({**state, "stale": 1}, "unknown ['stale']")):
            with pytest.raises(ValueError, match=re.escape(error)):
                build_algorithm(config, engine).load_state_dict(broken)
        resumed = build_algorithm(config, engine)
        resumed.load_state_dict(state)
        _play(config, engine, algorithm, range(3, 5))
        _play(config, engine, resumed, range(3, 5))
        assert resumed.clusters() == algorithm.clusters()
        for c in range(engine.num_clients):
            assert torch.equal(resumed.model_of(c), algorithm.model_of(c)), c
        assert [d.as_dict() for d in resumed.decisions] == [
            d.as_dict() for d in algorithm.decisions]
    finally:
        engine.close()


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_partition_diagnostics_and_a_silent_client_under_partial_participation(
        name: str) -> None:
    config, engine, algorithm = _setup(name, fraction=0.5, engine_cls=SilentClient)
    try:
        for diagnostics in _play(config, engine, algorithm, range(1, 6)):
            json.dumps(diagnostics)  # JSON-serialisable, no tensors or numpy scalars
            _covers_everyone_once(algorithm, engine.num_clients)
        engine.finish(algorithm, 5, list(range(engine.num_clients)))
        _covers_everyone_once(algorithm, engine.num_clients)
        json.dumps([d.as_dict() for d in algorithm.decisions])
        json.dumps(algorithm.thresholds())
        assert engine.missing.get(SilentClient.silent), "the silent client is recorded missing"
        evaluation = engine.evaluate(algorithm, 5)
        assert set(evaluation) == set(range(engine.num_clients)) - {SilentClient.silent}
        soft = algorithm.memberships()
        if soft is not None:
            assert soft.shape[0] == engine.num_clients
            assert torch.allclose(torch.as_tensor(soft).sum(1).double(),
                                  torch.ones(engine.num_clients, dtype=torch.float64))
    finally:
        engine.close()


def test_resuming_from_a_state_with_a_key_missing_is_one_error_naming_the_checkpoint(
        tmp_path: Path, cli) -> None:
    raw = small_config(rounds=2, algorithm={"name": "incremental", **QUICK["incremental"]})
    out = tmp_path / "run"
    run_experiment(validate(raw), out, quiet=True)
    checkpoint = out / "checkpoints" / "last.pt"
    state = torch.load(checkpoint, weights_only=True)
    del state["algorithm"]["evidence"]
    torch.save(state, checkpoint)
    summary = (out / "summary.json").read_text()
    (tmp_path / "run.yaml").write_text((out / "config.yaml").read_text())
    one_error_line(*cli("run", str(tmp_path / "run.yaml"), "--out", str(out), "--resume"),
                   str(checkpoint), "missing ['evidence']")
    assert (out / "summary.json").read_text() == summary
