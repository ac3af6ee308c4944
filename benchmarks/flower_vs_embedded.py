"""Seconds per round of the same experiment in the embedded engine and on Flower's simulation
runtime (Ray), plus end-to-end seconds (start-up included).

Workload: CFL on `mnist5k`, MLP 784-100-10, 4 label-permutation groups, 1 local epoch, batch 32,
evaluation every round. Per-round time is `summary.json`'s `timing.round_seconds / rounds` (the
whole loop of a round: training, aggregation, evaluation, logging, checkpoints); end-to-end is
the wall time of the command. Not yet measured here: Flower's own FedAvg on the same model.

    .venv/bin/python benchmarks/flower_vs_embedded.py --clients 20,100 --rounds 10
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="20,100")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for clients in [int(c) for c in args.clients.split(",")]:
            for engine in ("embedded", "flower"):
                row = measure(clients, args.rounds, engine, Path(tmp))
                rows.append(row)
                print(f"{clients:4d} clients  {engine:8s}  {row['seconds_per_round']:.3f} s/round"
                      f"  end-to-end {row['end_to_end_seconds']:.1f} s  accuracy "
                      f"{row['accuracy']:.3f}  clusters {row['clusters']}", flush=True)
    for clients in sorted({r["clients"] for r in rows}):
        emb, flw = (next(r for r in rows if r["clients"] == clients and r["engine"] == e)
                    for e in ("embedded", "flower"))
        ratio = flw["seconds_per_round"] / emb["seconds_per_round"]
        print(f"{clients} clients: embedded is {ratio:.1f}x faster per round than Flower "
              "simulation")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
