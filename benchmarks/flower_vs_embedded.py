"""Seconds per round of the same experiment in the embedded engine and on Flower's simulation
runtime (Ray), plus end-to-end seconds (start-up included).

Workload: CFL on `mnist5k`, MLP 784-100-10, 4 label-permutation groups, 1 local epoch, batch 32,
evaluation every round. Per-round time is `summary.json`'s `timing.round_seconds / rounds` (the
whole loop of a round: training, aggregation, evaluation, logging, checkpoints); end-to-end is
the wall time of the command. The reference is Flower's own FedAvg strategy with fedflock's model,
data and local training (`benchmarks/flower_fedavg_app`), timed from after a warm-up message
(as fedflock's handshake) to the end of its rounds.

    .venv/bin/python -m benchmarks.flower_vs_embedded --clients 20,100 --rounds 10

`--rows FILE` also writes one JSON line per client count: what the `flower-vs-embedded` table
of `benchmarks/reproduce.py` renders.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.tables import append_row, machine_facts


def config(clients: int, rounds: int, engine: str) -> dict:
    return {
        "seed": 0, "rounds": rounds, "engine": engine,
        "data": {"dataset": "mnist5k", "clients": clients, "samples_per_client": 4000 // clients,
                 "test_per_client": 1000 // clients,
                 "scenario": {"kind": "label_permutation", "groups": 4}},
        "model": {"name": "mlp", "hidden": [100]},
        "training": {"local_epochs": 1, "lr": 0.1, "batch_size": 32},
        "algorithm": {"name": "cfl"}, "checkpoint_every": rounds,
    }


def measure(clients: int, rounds: int, engine: str, workdir: Path) -> dict:
    path = workdir / f"{engine}-{clients}.yaml"
    path.write_text(yaml.safe_dump(config(clients, rounds, engine)))
    out = workdir / f"{engine}-{clients}"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fedflock", "run", str(path), "--out", str(out),
                           "-q"], capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{engine} at {clients} clients failed: {done.stderr.strip()}")
    summary = json.loads((out / "summary.json").read_text())
    return {"engine": engine, "clients": clients, "rounds": rounds,
            "seconds_per_round": summary["timing"]["round_seconds"] / rounds,
            "end_to_end_seconds": wall, "accuracy": summary["accuracy"]["mean"],
            "clusters": summary["num_clusters"]}


def measure_flower_fedavg(clients: int, rounds: int, workdir: Path) -> dict:
    """Flower's own FedAvg strategy (benchmarks/flower_fedavg_app) on the same workload."""
    from fedflock.engines.flower.local import flower_env
    from fedflock.engines.flower.processes import OwnedProcesses

    path = workdir / f"fedavg-{clients}.yaml"
    path.write_text(yaml.safe_dump(config(clients, rounds, "flower")))
    home, out = workdir / f"home-{clients}", workdir / f"fedavg-{clients}"
    home.mkdir()
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = ":local:"\n'
        f"options.num-supernodes = {clients}\n"
        "options.backend.client-resources.num-cpus = 1\n")
    env = flower_env(home) | {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    start = time.perf_counter()
    with OwnedProcesses(env) as owned:  # flwr's detached SuperLink and Ray end with the block
        done = owned.run(["flwr", "run", str(Path(__file__).parent / "flower_fedavg_app"), "sim",
                          "--stream", "--run-config", f'config="{path}" out="{out}"'],
                         timeout=3600, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"flwr run failed: {done.stdout.decode()[-2000:]}")
    wall = time.perf_counter() - start
    timing = json.loads((out / "timing.json").read_text())
    return {"engine": "flower-fedavg", "clients": clients, "rounds": rounds,
            "seconds_per_round": timing["seconds"] / rounds, "end_to_end_seconds": wall,
            "accuracy": None, "clusters": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="20,100")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--rows", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    machine = machine_facts()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for clients in [int(c) for c in args.clients.split(",")]:
            for engine in ("embedded", "flower", "flower-fedavg"):
                row = (measure_flower_fedavg(clients, args.rounds, Path(tmp))
                       if engine == "flower-fedavg"
                       else measure(clients, args.rounds, engine, Path(tmp)))
                rows.append(row)
                print(f"{clients:4d} clients  {engine:13s}  {row['seconds_per_round']:.3f} "
                      f"s/round  end-to-end {row['end_to_end_seconds']:.1f} s  accuracy "
                      f"{row['accuracy']}  clusters {row['clusters']}", flush=True)
    for clients in sorted({r["clients"] for r in rows}):
        emb, flw, ref = (next(r for r in rows if r["clients"] == clients and r["engine"] == e)
                         for e in ("embedded", "flower", "flower-fedavg"))
        ratio = flw["seconds_per_round"] / emb["seconds_per_round"]
        overhead = flw["seconds_per_round"] / ref["seconds_per_round"] - 1
        print(f"{clients} clients: embedded is {ratio:.1f}x faster per round than fedflock on "
              f"Flower simulation; fedflock on Flower vs Flower's FedAvg: {overhead:+.0%}")
        if args.rows:
            append_row(args.rows, {
                "clients": clients, "rounds": args.rounds,
                "embedded_seconds": emb["seconds_per_round"],
                "flower_seconds": flw["seconds_per_round"],
                "fedavg_seconds": ref["seconds_per_round"], "embedded_faster": ratio,
                "flower_vs_fedavg": 100 * overhead, "embedded_e2e": emb["end_to_end_seconds"],
                "flower_e2e": flw["end_to_end_seconds"], "embedded_accuracy": emb["accuracy"],
                "flower_accuracy": flw["accuracy"], "machine": machine})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
