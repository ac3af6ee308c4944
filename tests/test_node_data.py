"""What a deployed node costs: it loads only its own data (a node-local cache of its scenario
partition, or its own files), and a round is one message per sampled client (the evaluation of
the model it receives travels with its training)."""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from flwr.supercore.task_identity import TaskIdentity

from fedflock.data.partition import (
    PartitionCacheWarning,
    load_node_files,
    scenario_partition,
)
from fedflock.data.scenarios import build_federated_data
from fedflock.engines.flower.engine import FlowerEngine
from fedflock.engines.flower.processes import TOKEN, processes_carrying
from fedflock.engines.flower.worker import workers_folder
from fedflock.errors import DataError
from fedflock.experiment import Run, run_experiment, without_timings
from fedflock.validation import validate
from tests.conftest import small_config, tiny_text_config
from tests.inprocess_grid import InProcessGrid

ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def _same_client(a, b) -> bool:
    return all(torch.equal(getattr(a, n), getattr(b, n)) for n in ARRAYS)


# -- the partition cache -----------------------------------------------------------------------

def test_a_partition_comes_from_the_cache_equal_to_the_scenario(tmp_path: Path,
                                                                monkeypatch) -> None:
    cfg = validate(small_config())
    full = build_federated_data(cfg.data, cfg.seed)
    first = scenario_partition(cfg.data, cfg.seed, 4, tmp_path)
    files = sorted(tmp_path.glob("*.npz"))
    assert len(files) == cfg.data.clients  # one draw wrote every partition
    # Later messages read their own file only: drawing the federation again would fail here.
    monkeypatch.setattr("fedflock.data.partition.build_federated_data",
                        lambda *a: pytest.fail("the federation was drawn again"))
    for partition in (4, 1):
        node = scenario_partition(cfg.data, cfg.seed, partition, tmp_path)
        assert _same_client(node.client, full.clients[partition])
        assert node.group == int(full.groups[partition]) and node.spec == full.spec
        assert node.sizes == full.sizes and node.num_clients == cfg.data.clients
    assert _same_client(first.client, full.clients[4])
    # another seed is another federation: its own files
    monkeypatch.undo()
    other = scenario_partition(cfg.data, cfg.seed + 1, 4, tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 2 * cfg.data.clients
    assert not _same_client(other.client, first.client)


@pytest.mark.parametrize("damage", ["truncated", "not a zip", "other federation"])
def test_a_damaged_cache_file_is_rebuilt_with_a_warning(tmp_path: Path, damage: str) -> None:
    cfg = validate(small_config())
    good = scenario_partition(cfg.data, cfg.seed, 2, tmp_path)
    (path,) = tmp_path.glob("*-p2.npz")
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "not a zip":
        path.write_text("hello")
    else:  # a readable file written for another seed, renamed over this one
        scenario_partition(cfg.data, cfg.seed + 1, 2, tmp_path / "other")
        (foreign,) = (tmp_path / "other").glob("*-p2.npz")
        path.write_bytes(foreign.read_bytes())
    with pytest.warns(PartitionCacheWarning, match="rebuilding"):
        rebuilt = scenario_partition(cfg.data, cfg.seed, 2, tmp_path)
    assert _same_client(rebuilt.client, good.client)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt file is whole again
        assert _same_client(scenario_partition(cfg.data, cfg.seed, 2, tmp_path).client,
                            good.client)


def test_a_partition_outside_the_federation_is_refused(tmp_path: Path) -> None:
    cfg = validate(small_config())
    with pytest.raises(DataError, match=r"outside 0\.\.5"):
        scenario_partition(cfg.data, cfg.seed, 6, tmp_path)


# -- a device's own files ----------------------------------------------------------------------

def _device_file(path: Path, client, **extra: np.ndarray) -> Path:
    np.savez(path, x=client.x_train.numpy(), y=client.y_train.numpy(),
             x_test=client.x_test.numpy(), y_test=client.y_test.numpy(), **extra)
    return path


def test_a_node_serves_its_own_files(tmp_path: Path) -> None:
    cfg = validate(small_config())
    full = build_federated_data(cfg.data, cfg.seed)
    path = _device_file(tmp_path / "mine.npz", full.clients[3], num_classes=np.array(10))
    node = load_node_files(path, 3, cfg.data.clients)
    assert _same_client(node.client, full.clients[3])
    assert node.group is None and node.spec == full.spec and node.sizes == (40,)


@pytest.mark.parametrize("arrays, message", [
    ({"x": np.zeros((4, 64), np.float32), "y": np.zeros(4, np.int64)}, "missing array"),
    ({"x": np.zeros((4, 64), np.float32), "y": np.zeros(3, np.int64),
      "x_test": np.zeros((2, 64), np.float32), "y_test": np.zeros(2, np.int64)}, "4 inputs"),
    ({"x": np.zeros((4, 64), np.float32), "y": np.full(4, 12),
      "x_test": np.zeros((2, 64), np.float32), "y_test": np.zeros(2, np.int64),
      "num_classes": np.array(10)}, r"labels must lie in 0\.\.9"),
    ({"x": np.zeros((4, 64), np.float32), "y": np.zeros(4, np.float32),
      "x_test": np.zeros((2, 64), np.float32), "y_test": np.zeros(2, np.int64)}, "integer"),
    ({"x": np.zeros((4, 64), np.float32), "y": np.zeros(4, np.int64),
      "x_test": np.zeros((2, 8), np.float32), "y_test": np.zeros(2, np.int64)}, "shape"),
])
def test_bad_node_files_get_one_line_saying_why(tmp_path: Path, arrays: dict,
                                                message: str) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=message) as err:
        load_node_files(path, 0, 4)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    path.write_text("not an npz")
    with pytest.raises(DataError, match=r"not a readable \.npz"):
        load_node_files(path, 0, 4)
    with pytest.raises(DataError, match="no such file"):
        load_node_files(tmp_path / "absent.npz", 0, 4)


# -- one message per client and round ---------------------------------------------------------

def _flower_run(tmp_path: Path, raw: dict, name: str,
                node_config: dict[int, dict[str, str]] | None = None
                ) -> tuple[dict, InProcessGrid]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = validate(raw)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    grid = InProcessGrid(path, {100 + c: c for c in range(cfg.data.clients)},
                         node_config=node_config)
    engine = FlowerEngine(grid, cfg, timeout=1.0, connect_timeout=1.0)
    return Run(cfg, tmp_path / name, quiet=True).execute(engine=engine), grid


def _comparable(summary: dict) -> dict:
    return {k: v for k, v in without_timings(summary).items() if k not in ("engine", "executor")}


@pytest.mark.parametrize("algorithm", ["cfl", "ifca"])
def test_one_message_rounds_give_the_embedded_summary(tmp_path: Path, algorithm: str) -> None:
    """Flower with evaluation in the training message (the default there): one message per
    sampled client and round, the final evaluation after the last; summary.json equals the
    embedded engine's, which evaluates every client separately."""
    settings = {"cfl": {"algorithm": {"name": "cfl", "warmup_rounds": 1, "patience": 1}},
                "ifca": {"algorithm": {"name": "ifca", "clusters": 2}}}[algorithm]
    raw = small_config(rounds=4, **{"participation.fraction": 0.5}) | settings
    embedded = run_experiment(validate(raw), tmp_path / "embedded", quiet=True)
    summary, grid = _flower_run(tmp_path, raw, "flower")
    assert _comparable(summary) == _comparable(embedded)
    records = [json.loads(r) for r in (tmp_path / "flower" / "metrics.jsonl").read_text()
               .splitlines()]
    sent = [t for t in grid.sent if t != "query"]
    bundles = [t for t in sent if t.startswith("train.evaluate__")]
    # rounds 1..3: one message per sampled client; round 4 trains, then everyone is evaluated
    # (IFCA: once more after its final selection, as on the embedded engine)
    assert len(bundles) == sum(r["participants"] for r in records[:-1])
    finals = 2 if algorithm == "ifca" else 1
    assert sent.count("train.evaluate") == finals * raw["data"]["clients"]
    assert all(r["evaluated"] == "received" for r in records[:-1])
    assert all(len(r["evaluated_clients"]) == r["participants"] for r in records[:-1])
    assert "evaluated" not in records[-1] and len(records[-1]["accuracy"]) == 6


def test_separate_evaluation_stays_available_and_agrees(tmp_path: Path) -> None:
    raw = small_config(rounds=3, eval_mode="separate")
    embedded = run_experiment(validate(raw), tmp_path / "embedded", quiet=True)
    summary, grid = _flower_run(tmp_path, raw, "flower")
    assert _comparable(summary) == _comparable(embedded)
    assert not any("__" in t for t in grid.sent)
    assert grid.sent.count("train.evaluate") == 3 * raw["data"]["clients"]


def test_nodes_serving_their_own_files_run_without_a_hidden_group(tmp_path: Path) -> None:
    raw = small_config(rounds=2)
    cfg = validate(raw)
    full = build_federated_data(cfg.data, cfg.seed)
    files = {100 + c: {"data-path": str(_device_file(tmp_path / f"node{c}.npz", client,
                                                      num_classes=np.array(10)))}
             for c, client in enumerate(full.clients)}
    summary, _ = _flower_run(tmp_path, raw, "files", files)
    assert summary["ari"] is None and summary["true_groups"] is None
    embedded = run_experiment(validate(raw), tmp_path / "embedded", quiet=True)
    assert summary["accuracy"] == embedded["accuracy"]  # the same data, from the files


def test_text_nodes_from_the_cache_and_from_their_own_files_run_as_embedded(
        shared_data: Path, tmp_path: Path) -> None:
    """Next-token data on nodes: the partition cache keeps 2-D targets, the objective and the
    tokenizer, and a device's own token file (targets shaped as its inputs, its tokenizer
    beside them) is read as next-token data; the run directory keeps the nodes' tokenizer as
    the embedded engine's does."""
    raw = tiny_text_config(shared_data)
    cfg = validate(raw)
    full = build_federated_data(cfg.data, cfg.seed)
    node = scenario_partition(cfg.data, cfg.seed, 1, tmp_path / "cache")
    again = scenario_partition(cfg.data, cfg.seed, 1, tmp_path / "cache")  # from the file
    assert _same_client(again.client, full.clients[1]) and again.spec == full.spec == node.spec
    assert again.spec.objective == "next_token" and again.client.y_train.ndim == 2
    assert again.tokenizer == full.tokenizer is not None
    embedded = run_experiment(cfg, tmp_path / "embedded", quiet=True)
    assert embedded["data_source"] == "ag_news/test.csv: 7,600 articles"
    tokenizer = (tmp_path / "embedded" / "tokenizer.json").read_text()
    cached, _ = _flower_run(tmp_path, raw, "cached")
    assert cached["perplexity"] == embedded["perplexity"]
    assert (tmp_path / "cached" / "tokenizer.json").read_text() == tokenizer
    files = {100 + c: {"data-path": str(_device_file(
        tmp_path / f"node{c}.npz", client, vocab_size=np.array(full.vocab_size),
        tokenizer=np.array(full.tokenizer)))} for c, client in enumerate(full.clients)}
    own = load_node_files(Path(files[101]["data-path"]), 1, 4)
    assert own.spec == full.spec and own.tokenizer == full.tokenizer
    summary, _ = _flower_run(tmp_path, raw, "files", files)
    assert summary["perplexity"] == embedded["perplexity"]  # the same data, from the files
    assert (tmp_path / "files" / "tokenizer.json").read_text() == tokenizer


def test_nodes_cut_by_another_tokenizer_are_refused(shared_data: Path, tmp_path: Path) -> None:
    """Token ids mean nothing under another vocabulary: a node whose tokenizer differs from the
    first node's is refused at the handshake, and the run goes on without it."""
    raw = tiny_text_config(shared_data)
    full = build_federated_data(validate(raw).data, 0)
    other = build_federated_data(validate(raw | {"seed": 1}).data, 1)
    assert other.tokenizer != full.tokenizer
    files = {100 + c: {"data-path": str(_device_file(
        tmp_path / f"node{c}.npz", client, vocab_size=np.array(full.vocab_size),
        tokenizer=np.array(other.tokenizer if c == 3 else full.tokenizer)))}
        for c, client in enumerate(full.clients)}
    summary, _ = _flower_run(tmp_path, raw, "mixed", files)
    refused = [r for r in summary["rejected_replies"] if r["client"] is None or r["client"] == 3]
    assert refused and "tokenizer differs" in refused[0]["reason"], summary["rejected_replies"]
    assert summary["perplexity"]["per_client"][3] is None


def test_node_workers_answer_for_the_clientapp_and_give_the_same_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
        ) -> None:
    """`worker=true`: each node's messages are answered by one long-lived worker process of
    that node (no torch import per message); the run equals the embedded engine's, client state
    included, and no message fell back to in-process work."""
    token = secrets.token_hex(8)
    monkeypatch.setenv(TOKEN, token)  # the workers inherit it: found and ended below
    raw = small_config(rounds=3, **{"participation.fraction": 0.5})
    embedded = run_experiment(validate(raw), tmp_path / "embedded", quiet=True)
    workers = {100 + c: {"worker": "true"} for c in range(raw["data"]["clients"])}
    try:
        with caplog.at_level(logging.WARNING, logger="fedflock.worker"):
            summary, _ = _flower_run(tmp_path, raw, "workers", workers)
        running = processes_carrying(token)
        files = {p for p in workers_folder().iterdir() if p.suffix == ".sock"}
    finally:
        for pid in processes_carrying(token):
            os.kill(pid, signal.SIGTERM)  # as a node's shutdown: the worker removes its files
        deadline = time.monotonic() + 20
        while processes_carrying(token) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert _comparable(summary) == _comparable(embedded)
    assert len(running) == raw["data"]["clients"]  # one worker per node, started once
    assert not any(p.exists() for p in files)  # ended workers leave no socket behind
    assert not [r for r in caplog.records if "answering in this process" in r.getMessage()]


def test_an_unreachable_worker_falls_back_to_in_process_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
        ) -> None:
    """A socket path too long for AF_UNIX (a deep TMPDIR): every message is answered in the
    ClientApp's own process at once, with a warning, and the run is unchanged."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(deep))
    raw = small_config(rounds=2)
    embedded = run_experiment(validate(raw), tmp_path / "embedded", quiet=True)
    workers = {100 + c: {"worker": "true"} for c in range(raw["data"]["clients"])}
    with caplog.at_level(logging.WARNING, logger="fedflock.worker"):
        summary, _ = _flower_run(tmp_path, raw, "fallback", workers)
    assert _comparable(summary) == _comparable(embedded)
    warned = [r.getMessage() for r in caplog.records if "too long" in r.getMessage()]
    assert warned and all("answering in this process" in w for w in warned)
