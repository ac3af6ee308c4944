"""Scale of incremental clustering: the server's cost of similarity and clustering.

1. `run`: a real run, 10,000 clients on MNIST with 1% (100) sampled per round: per-round server
   seconds for the similarity update, the clustering round, the store's memory, the process's
   peak RSS (the run goes first, so that peak is its own), and the final ARI.
2. `sketch`: the same run twice, each in its own process (so each peak RSS is its own): exact
   updates, then count sketches of 4,096 dimensions; the ARI between their final partitions.
3. `store`: one round of `IncrementalSimilarity.add` (k new updates against n stored, the MLP's
   update size) for growing n: seconds and memory grow with k x n, never n x n.
4. `louvain`: NetworkX vs igraph Louvain on the dense positive-cosine graph of n clients.

    python benchmarks/incremental_scale.py                 # run, store, louvain
    python benchmarks/incremental_scale.py --parts sketch
    python benchmarks/incremental_scale.py --parts run --clients 100000 --samples 12 --rounds 40 \
        --executor sequential
      # 100,000 clients: sketched updates and a k-nearest-neighbour graph, both by `auto`
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from fedflock.clustering.communities import affinity, louvain
from fedflock.experiment import run_experiment
from fedflock.similarity.incremental import IncrementalSimilarity
from fedflock.validation import validate

MLP_SIZE = 784 * 100 + 100 + 100 * 10 + 10  # the update size of the MNIST MLP [100]


def bench_store(sizes: list[int], new: int, dim: int) -> None:
    print(f"\n## store: one round of {new} new updates (d={dim}) against n stored")
    print("| stored n | seconds | ns per (new, stored) pair | store MB |")
    print("|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for n in sizes:
        store = IncrementalSimilarity("cosine")
        # n stored updates, written directly (their own n x n values do not matter here)
        store.clients, store.slot = list(range(n)), {c: c for c in range(n)}
        store._grow(n + new, dim)  # room for the new ones: the round itself never reallocates
        store.updates[:n] = torch.randn(n, dim, generator=gen)
        store.sq[:n] = store.updates[:n].double().pow(2).sum(1)
        batch = torch.randn(new, dim, generator=gen)
        clients = list(range(n, n + new))
        t0 = time.perf_counter()
        store.add(clients, batch)
        seconds = time.perf_counter() - t0
        print(f"| {n} | {seconds:.3f} | {seconds / (new * n) * 1e9:.1f} | "
              f"{store.nbytes / 2**20:.0f} |")


def bench_louvain(sizes: list[int]) -> None:
    print("\n## louvain: dense graph of n clients in 4 groups (positive cosine edges)")
    print("| n | edges | networkx s | igraph s | same partition |")
    print("|---|---|---|---|---|")
    for n in sizes:
        rng = np.random.default_rng(0)
        labels = rng.integers(0, 4, n)
        sim = np.where(labels[:, None] == labels[None, :], 0.5, -0.1) + rng.normal(0, 0.1, (n, n))
        weights = affinity((sim + sim.T) / 2, True)
        edges = int((np.triu(weights, 1) > 0).sum())
        timings, parts = {}, {}
        for backend in ("networkx", "igraph"):
            louvain(weights[:8, :8], backend=backend)  # import and warm up outside the timing
            t0 = time.perf_counter()
            parts[backend] = sorted(map(tuple, louvain(weights, backend=backend).parts))
            timings[backend] = time.perf_counter() - t0
        print(f"| {n} | {edges} | {timings['networkx']:.2f} | {timings['igraph']:.2f} | "
              f"{parts['networkx'] == parts['igraph']} |")


def bench_run(clients: int, rounds: int, samples: int, params: dict[str, object],
              executor: str = "auto", clusters_to: Path | None = None) -> None:
    raw = {
        "seed": 0, "rounds": rounds,
        "data": {"dataset": "mnist", "clients": clients, "samples_per_client": samples,
                 "test_per_client": max(2, samples // 4),
                 "scenario": {"kind": "label_permutation", "groups": 4}},
        "model": {"name": "mlp", "hidden": [100]},
        "training": {"local_epochs": 3, "lr": 0.1, "batch_size": 10, "executor": executor},
        "participation": {"fraction": 0.01},
        "algorithm": {"name": "incremental", **params},
        "eval_every": rounds, "checkpoint_every": rounds,
    }
    print(f"\n## run: {clients} clients ({samples} samples each), 1% per round, {rounds} rounds, "
          f"MNIST label_permutation (4 groups), {json.dumps(params) if params else 'defaults'}")
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 10,000 x 20 samples reuse MNIST's 60,000
        t0 = time.perf_counter()
        summary = run_experiment(validate(raw), Path(tmp) / "run", quiet=True)
        wall = time.perf_counter() - t0
        records = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").open()]
    fedavg_phase = [r for r in records if "similarity_seconds" in r]
    print("| round | stored | similarity s | store MB | aggregate s | train s | round s |")
    print("|---|---|---|---|---|---|---|")
    step = max(1, len(fedavg_phase) // 8)
    for r in fedavg_phase[::step] + fedavg_phase[-1:]:
        timing = r["timing"]
        print(f"| {r['round']} | {r['stored']} | {r['similarity_seconds']:.3f} | "
              f"{r['similarity_mb']:.0f} | {timing['aggregate']:.3f} | "
              f"{timing['train']:.2f} | {sum(timing.values()):.2f} |")
    clustered = next((r for r in records if "clustering_seconds" in r), None)
    if clustered:
        print(f"\nclustering at round {clustered['round']}: {clustered['stored']} clients, "
              f"graph + Louvain + merge test {clustered['clustering_seconds']:.2f} s, modularity "
              f"{clustered['modularity']}, {clustered['communities']} communities")
    after = [r for r in records if r["round"] > (clustered or {"round": rounds})["round"]]
    if after:
        server = np.median([r["timing"]["aggregate"] for r in after])
        print(f"after clustering: server (aggregate) {server:.3f} s per round (median of "
              f"{len(after)})")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"final: ARI {summary['ari']:.3f}, accuracy {summary['accuracy']['mean']:.3f}, "
          f"{summary['num_clusters']} clusters; wall {wall:.0f} s; peak RSS {peak:.2f} GiB")
    if clusters_to is not None:
        clusters_to.write_text(json.dumps({"clusters": summary["clusters"], "peak_gib": peak}))


def bench_sketch(clients: int, rounds: int, samples: int) -> None:
    """The run exact and sketched, each in a fresh process; the ARI between their partitions."""
    from sklearn.metrics import adjusted_rand_score

    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, sketch in (("exact", None), ("sketched", 4096)):
            out = Path(tmp) / f"{name}.json"
            subprocess.run([sys.executable, __file__, "--parts", "run", "--clients", str(clients),
                            "--rounds", str(rounds), "--samples", str(samples),
                            "--params", json.dumps({"sketch": sketch}),
                            "--clusters-to", str(out)], check=True)
            found[name] = json.loads(out.read_text())

    def labels(clusters: list[list[int]]) -> list[int]:
        of = {c: k for k, members in enumerate(clusters) for c in members}
        return [of[c] for c in range(clients)]

    agreement = adjusted_rand_score(labels(found["exact"]["clusters"]),
                                    labels(found["sketched"]["clusters"]))
    print(f"\n## sketch: ARI between the exact and the sketched partition {agreement:.3f}; "
          f"peak RSS exact {found['exact']['peak_gib']:.2f} GiB, sketched "
          f"{found['sketched']['peak_gib']:.2f} GiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="store,louvain,run")
    parser.add_argument("--stored", default="1000,2000,5000,10000")
    parser.add_argument("--new", type=int, default=100)
    parser.add_argument("--graph-sizes", default="250,500,1000,2000")
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--samples", type=int, default=20, help="training samples per client")
    parser.add_argument("--params", default="{}", help="JSON incremental parameters for run")
    parser.add_argument("--executor", default="auto", help="run: training executor "
                        "(sequential: no worker processes, so the peak RSS is the whole run's)")
    parser.add_argument("--clusters-to", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    parts = args.parts.split(",")
    if "run" in parts:  # first, so that the peak RSS it prints is the run's own
        bench_run(args.clients, args.rounds, args.samples, json.loads(args.params),
                  args.executor, args.clusters_to)
    if "sketch" in parts:
        bench_sketch(args.clients, args.rounds, args.samples)
    if "store" in parts:
        bench_store([int(x) for x in args.stored.split(",")], args.new, MLP_SIZE)
    if "louvain" in parts:
        bench_louvain([int(x) for x in args.graph_sizes.split(",")])


if __name__ == "__main__":
    main()
