"""fedflock on real Flower processes on 127.0.0.1: a SuperLink and one SuperNode per client.

Every process is torn down when a test ends, also on failure (LocalDeployment ends every process
it started and their descendants, and the tests check that none is left).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fedflock.engines.flower.credentials import write_credentials, write_node_key
from fedflock.engines.flower.local import LocalDeployment
from fedflock.engines.flower.processes import processes_carrying
from fedflock.experiment import run_experiment
from fedflock.validation import validate
from tests.conftest import apply_dotted, tiny_text_config

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "configs" / "flower_demo.yaml"
# Flower 1.42 starts one ClientApp process per message (about 5 s of CPU each here), so the
# tests keep rounds few: split from round 1, evaluate only at the end.
FAST = {"rounds": 4, "eval_every": 4, "algorithm.warmup_rounds": 1, "algorithm.patience": 1}


def _overrides(settings: dict) -> str:
    return 'set="' + ";".join(f"{k}={v}" for k, v in settings.items()) + '"'


def _wait_for(path: Path, deployment: LocalDeployment, timeout: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file():
            return json.loads(path.read_text())
        error = path.parent / "error.txt"
        if error.is_file():
            raise AssertionError(f"the ServerApp failed: {error.read_text()}")
        time.sleep(0.5)
    logs = "\n".join(p.read_text()[-1500:] for p in sorted(deployment.workdir.glob("*.log")))
    raise AssertionError(f"no {path.name} after {timeout} s; logs:\n{logs}")


def test_masked_cfl_over_tls_with_node_authentication_matches_the_embedded_engine(
        tmp_path: Path) -> None:
    """TLS under a CA made here, and a SuperLink that admits only registered SuperNodes: the
    registered nodes run the experiment, a node with an unregistered key is refused and the run
    completes without it. Permutation masking on, its seed only in the SuperNodes' node config:
    the server clusters masked updates and must still find exactly the embedded engine's
    (unmasked) clusters."""
    raw = apply_dotted(yaml.safe_load(DEMO.read_text()), FAST)
    embedded = run_experiment(validate({**raw, "engine": "embedded"}), tmp_path / "embedded",
                              quiet=True)
    assert embedded["splits"], "the demo config should split in the embedded engine"
    out = tmp_path / "flower-run"
    nodes = raw["data"]["clients"]
    credentials = write_credentials(tmp_path / "credentials", nodes)
    stranger = tmp_path / "stranger.key"
    write_node_key(stranger)  # a key pair nobody registered
    secret = dict.fromkeys(range(nodes), "mask-seed=4242")
    with LocalDeployment(nodes, tmp_path / "deployment", node_config=secret,
                         credentials=credentials, authenticate=True) as deployment:
        intruder = deployment.start_node(0, key=stranger, name="intruder")
        submitted = deployment.submit(DEMO, out, f"round-timeout=60.0 {_overrides(FAST)}")
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        summary = _wait_for(out / "summary.json", deployment)
        refused = intruder.poll()
        intruder_log = (deployment.workdir / "intruder.log").read_text()
        registered_logs = [(deployment.workdir / f"supernode{i}.log").read_text()
                           for i in range(nodes)]
    assert processes_carrying(deployment.owned.token) == []
    with socket.socket() as probe:  # nothing is left listening
        assert probe.connect_ex(("127.0.0.1", deployment.port)) != 0
    assert refused is not None and refused != 0, intruder_log[-2000:]
    # refused by the SuperLink when it asked to join (Flower's exit code 305), unlike the others
    assert "Failed to activate SuperNode" in intruder_log, intruder_log[-2000:]
    assert not any("Failed to activate" in log for log in registered_logs)
    assert "rejected_replies" not in summary  # the intruder never got as far as a reply
    assert summary["engine"] == "flower"
    assert summary["clusters"] == embedded["clusters"]
    assert summary["ari"] == embedded["ari"] == 1.0
    assert abs(summary["accuracy"]["mean"] - embedded["accuracy"]["mean"]) <= 0.02
    assert [s["round"] for s in summary["splits"]] == [s["round"] for s in embedded["splits"]]
    rounds = (out / "metrics.jsonl").read_text().splitlines()
    assert len(rounds) == raw["rounds"]
    # The run directory's config (the server's view) holds no masking secret.
    assert yaml.safe_load((out / "config.yaml").read_text())["privacy"]["masking"] is False


def test_a_killed_node_and_a_nan_node_do_not_corrupt_the_run(tmp_path: Path) -> None:
    raw = apply_dotted(yaml.safe_load(DEMO.read_text()), FAST)
    config = tmp_path / "faults.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "flower-run"
    misshapen, killed, corrupt = 1, 2, 3
    faults = {corrupt: 'fault="nan"', misshapen: 'fault="shape"'}
    with LocalDeployment(4, tmp_path / "deployment", node_config=faults) as dep:
        # Long enough for every live node to answer on 2 cores; the dead node costs one wait.
        submitted = dep.submit(config, out, "round-timeout=30.0")
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 180
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
            assert time.monotonic() < deadline, "the run did not reach round 2"
            assert not (out / "error.txt").is_file(), (out / "error.txt").read_text()
            time.sleep(0.2)
        dep.kill_node(killed)
        summary = _wait_for(out / "summary.json", dep)
    # Every live node answered every round; the refused replies count as missing too.
    every_round = list(range(1, raw["rounds"] + 1))
    assert summary["missing_rounds"] == {str(misshapen): every_round,
                                         str(killed): list(range(3, raw["rounds"] + 1)),
                                         str(corrupt): every_round}
    refused = summary["rejected_replies"]
    nan = [r["round"] for r in refused if r["client"] == corrupt and "NaN" in r["reason"]]
    shape = [r["round"] for r in refused if r["client"] == misshapen and "shape" in r["reason"]]
    assert nan == shape == every_round and len(refused) == 2 * len(every_round)
    assert sorted(c for cluster in summary["clusters"] for c in cluster) == list(range(4))
    per_client = summary["accuracy"]["per_client"]
    assert per_client[killed] is None
    assert all(0.0 <= a <= 1.0 for i, a in enumerate(per_client) if i != killed), per_client
    # No cluster model was corrupted: every parameter is finite, and the one client whose
    # updates were all accepted learned from them.
    state = torch.load(out / "checkpoints" / "last.pt", weights_only=True)["algorithm"]
    assert all(torch.isfinite(c["params"]).all() for c in state["clusters"])
    assert per_client[0] > 0.3


def test_a_text_deployment_cuts_tokens_as_the_embedded_run(shared_data: Path,
                                                          tmp_path: Path) -> None:
    """Next-token data on real SuperNodes: each node draws its partition of AG News into its
    cache (2-D targets, the next-token objective, the tokenizer), the server learns the
    tokenizer from the nodes and keeps it in the run directory, and the perplexity is the
    embedded engine's."""
    raw = tiny_text_config(shared_data)
    embedded = run_experiment(validate(raw), tmp_path / "embedded", quiet=True)
    config = tmp_path / "text.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "flower-run"
    with LocalDeployment(raw["data"]["clients"], tmp_path / "deployment") as deployment:
        submitted = deployment.submit(config, out, "round-timeout=60.0")
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        summary = _wait_for(out / "summary.json", deployment)
    assert processes_carrying(deployment.owned.token) == []
    assert summary["engine"] == "flower" and summary["primary_metric"] == "perplexity"
    assert summary["perplexity"]["mean"] == pytest.approx(embedded["perplexity"]["mean"],
                                                          rel=1e-4)
    assert summary["ari"] == embedded["ari"]
    assert (out / "tokenizer.json").read_text() == (
        tmp_path / "embedded" / "tokenizer.json").read_text()


# 8 clients, 4 sampled per round; clustering at round 2 with 7 seen; the unseen one is placed by
# a select task (K models down) in round 6; clients 0 and 5 send sign-flipped updates.
PARTIAL = {"rounds": 6, "eval_every": 6, "data.clients": 8, "data.samples_per_client": 80,
           "algorithm.name": "incremental",
           "algorithm.cluster_when": "settled", "algorithm.warmup_rounds": 2,
           "algorithm.patience": 1, "algorithm.cluster_round": 2, "algorithm.min_coverage": 0.0,
           "algorithm.placement_delay": 1, "participation.count": 4,
           "attack.kind": "sign_flip", "attack.fraction": 0.25}


# IFCA: K = 2 distinct initial models asked of a node (where the mask would be known), select
# tasks every round, final selection without training.
IFCA = {"rounds": 3, "eval_every": 3, "algorithm": {"name": "ifca", "clusters": 2}}


# PACFL: every client's bases through the codec in round 1 although 2 of 4 are sampled, then
# FedAvg per cluster on the sample.
PACFL = {"rounds": 3, "eval_every": 3, "algorithm": {"name": "pacfl"}, "participation.count": 2}


# The soft-membership methods: K models down, K updates (or a personal model) and weights up,
# the mixture evaluated and the alternative evaluation; 2 of 4 clients per round. FedRC's
# mixture round carries all that FedEM's does and its label marginals, so FedEM, the same code
# path, has no Flower run of its own.
SOFT = {"rounds": 2, "eval_every": 2, "participation.count": 2}
FEDRC = SOFT | {"algorithm": {"name": "fedrc", "clusters": 2}}
FEDSOFT = SOFT | {"algorithm": {"name": "fedsoft", "clusters": 2}}


# FedDAG with its dual encoder: every client's bases in round 1 (2 of 4 sampled), one warm-up
# round of all, the fused clustering, then the secondary encoder averaged across the
# complementary cluster too.
FEDDAG = {"rounds": 4, "eval_every": 4, "participation.count": 2, "model.dual_encoder": True,
          "algorithm": {"name": "feddag", "warmup_rounds": 1, "clusters": 2}}


# FL+HC: one warm-up round, the clustering round on the 2 sampled clients, the other two placed
# by their update at the global model when next sampled.
FLHC = {"rounds": 4, "eval_every": 4, "participation.count": 2,
        "algorithm": {"name": "flhc", "warmup_rounds": 1}}


@pytest.mark.parametrize("settings", [FAST, PARTIAL, IFCA, PACFL, FEDRC, FEDSOFT, FEDDAG, FLHC],
                         ids=["cfl", "incremental-partial-attack", "ifca", "pacfl", "fedrc",
                              "fedsoft", "feddag-dual", "flhc-partial"])
def test_flower_simulation_runtime_gives_the_embedded_clusters(tmp_path: Path,
                                                               settings: dict) -> None:
    """`fedflock run` with `engine: flower` goes through `flwr run` on Flower's simulation
    runtime (Ray): same clusters, same accuracy as the embedded engine; also with 2 of 4
    clients sampled per round, select tasks placing unseen clients, and a malicious client;
    and IFCA (K initial models from a node, select tasks)."""
    import subprocess
    import sys

    raw = apply_dotted(yaml.safe_load(DEMO.read_text()), settings)
    embedded = run_experiment(validate({**raw, "engine": "embedded"}), tmp_path / "embedded",
                              quiet=True)
    out = tmp_path / "simulated"
    sets = [arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")]
    done = subprocess.run([sys.executable, "-m", "fedflock", "run", str(DEMO), *sets,
                           "--out", str(out), "-q"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert processes_carrying() == []  # flwr's detached SuperLink and Ray ended too
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"] == "flower"
    assert summary["clusters"] == embedded["clusters"]
    assert abs(summary["accuracy"]["mean"] - embedded["accuracy"]["mean"]) <= 0.02
    assert summary["communication"] == embedded["communication"]
    assert summary.get("attack") == embedded.get("attack")
    if settings is IFCA:  # K models went down to every client every round and at the end
        assert summary["communication"]["down_floats"] >= 2 * summary["communication"][
            "up_floats"]
    if settings is FEDDAG:  # the fused clustering and the complements it chose
        ours, theirs = summary["splits"][0], embedded["splits"][0]
        assert (ours["members"], ours["complements"]) == (theirs["members"],
                                                          theirs["complements"])
        assert ours["complements"] == {"1": [2], "2": [1]}
    if settings is FLHC:  # clustered on the sample, the others placed later
        assert summary["splits"] == embedded["splits"] and sum(summary["splits"][0]["sizes"]) == 2
    if settings is PACFL:  # one clustering, on every client's bases
        assert [d["kind"] for d in summary["splits"]] == ["cluster"]
        assert sum(summary["splits"][0]["sizes"]) == raw["data"]["clients"]
    if settings in (FEDRC, FEDSOFT):  # the soft memberships and the other evaluation
        np.testing.assert_allclose(summary["memberships"], embedded["memberships"], atol=1e-4)
        assert summary["alternatives"].keys() == embedded["alternatives"].keys()
    if settings is PARTIAL:  # the scenario really clustered and placed a client by selection
        assert summary["splits"] and summary["splits"][0]["unseen"] == 1
        assert summary["communication"]["down_floats"] > summary["communication"]["up_floats"]


def test_compare_runs_a_plugin_algorithm_on_flower_simulation_as_embedded(
        tmp_path: Path) -> None:
    """`fedflock --plugin FILE compare` with `engine: flower`: each run goes through Flower's
    simulation runtime, and the plugin is loaded by Flower's ServerApp and ClientApps too
    (other processes, started from another directory)."""
    import subprocess
    import sys

    from fedflock.plugins import load_plugins

    example = str(REPO / "examples" / "custom_algorithm.py")
    settings = {"rounds": 1, "eval_every": 1, "algorithm": {"name": "example_fedprox", "mu": 0.5}}
    raw = apply_dotted(yaml.safe_load(DEMO.read_text()), settings)
    load_plugins([example])
    embedded = run_experiment(validate({**raw, "engine": "embedded"}), tmp_path / "embedded",
                              quiet=True)
    out = tmp_path / "simulated"
    sets = [arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")]
    done = subprocess.run([sys.executable, "-m", "fedflock", "--plugin",
                           str(Path(example).relative_to(REPO)), "compare", str(DEMO), *sets,
                           "--algorithms", "example_fedprox", "--out", str(out), "-q"],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert processes_carrying() == []
    summary = json.loads((out / "example_fedprox" / "seed0" / "summary.json").read_text())
    assert summary["engine"] == "flower" and summary["algorithm"] == "example_fedprox"
    assert abs(summary["accuracy"]["mean"] - embedded["accuracy"]["mean"]) <= 0.02
