"""Is a grid cell's group structure in its clients' updates at all? An upper bound for any
method that clusters by update similarity.

Runs the cell with FedAvg (one model, so every round's replies are computed at the same model
and differ by client, not by age), averages the cosine of every pair of clients over the rounds
in which both replied, and clusters that matrix with Louvain (positive averaged cosines as edge
weights, no threshold) and, given the true number of groups, with average linkage. Prints
the within- and between-group means and each partition's ARI against the groups.

    python benchmarks/coround_similarity.py --cell digits-rotation-g6-n43 --seed 0
    python benchmarks/coround_similarity.py --cell digits-rotation-g6-n43 --seed 0 \\
        --participation 1.0 --rounds 30
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import warnings
from pathlib import Path

import networkx as nx
import numpy as np
from sklearn.cluster import AgglomerativeClustering
from sklearn.metrics import adjusted_rand_score

from fedflock.algorithms.fedavg import FedAvg
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.experiment import run_experiment
from fedflock.validation import validate
from grid import draw_cells

ROUNDS: dict[int, list[tuple[int, np.ndarray]]] = {}  # round -> (client, unit update)


@ALGORITHMS.register("fedavg_recorded", "FedAvg that keeps each round's unit updates (analysis)")
class RecordedFedAvg(FedAvg):
    name = "fedavg_recorded"

    def aggregate_train(self, rnd, replies):
        for r in replies:
            update = r.update.double().numpy()
            ROUNDS.setdefault(rnd, []).append((r.client, update / np.linalg.norm(update)))
        return super().aggregate_train(rnd, replies)


def same_round_cosines(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean cosine of each pair over the rounds both replied in, and how many there were."""
    total, count = np.zeros((n, n)), np.zeros((n, n))
    for replies in ROUNDS.values():
        ids = np.array([client for client, _ in replies])
        units = np.stack([update for _, update in replies])
        total[np.ix_(ids, ids)] += units @ units.T
        count[np.ix_(ids, ids)] += 1
    np.fill_diagonal(count, 0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan), count


def louvain(mean: np.ndarray, seed: int) -> np.ndarray:
    graph = nx.Graph()
    graph.add_nodes_from(range(len(mean)))
    graph.add_weighted_edges_from((i, j, mean[i, j]) for i, j in
                                  itertools.combinations(range(len(mean)), 2) if mean[i, j] > 0)
    labels = np.zeros(len(mean), dtype=int)
    for k, members in enumerate(nx.community.louvain_communities(graph, seed=seed)):
        labels[list(members)] = k
    return labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", required=True, help="a grid cell's name or its start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--participation", type=float, default=None, help="instead of the cell's")
    parser.add_argument("--rounds", type=int, default=None, help="instead of the cell's")
    args = parser.parse_args()
    cell = next((c for c in draw_cells(60) if c.name.startswith(args.cell)), None)
    if cell is None:
        parser.error(f"no grid cell named {args.cell}")
    raw = cell.config("fedavg_recorded", args.seed)
    if args.participation is not None:
        raw["participation"] = {"fraction": args.participation}
    if args.rounds is not None:
        raw["rounds"] = raw["eval_every"] = raw["checkpoint_every"] = args.rounds
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = run_experiment(validate(raw), Path(out) / "run", quiet=True)
    groups = np.array(summary["true_groups"])
    n = len(groups)
    mean, count = same_round_cosines(n)
    same, pairs = groups[:, None] == groups[None, :], ~np.eye(n, dtype=bool)
    seen = pairs & (count > 0)
    print(f"{cell.name} seed {args.seed}: {raw['rounds']} rounds, participation "
          f"{raw['participation']['fraction']}")
    print(f"pairs that replied in a common round: {seen.sum() // 2} of {pairs.sum() // 2} "
          f"({count[seen].mean():.1f} rounds each on average)")
    print(f"mean same-round cosine within groups {np.nanmean(mean[same & pairs]):.3f} "
          f"(sd over pairs {np.nanstd(mean[same & pairs]):.3f}), between "
          f"{np.nanmean(mean[~same & pairs]):.3f} (sd {np.nanstd(mean[~same & pairs]):.3f})")
    for seed in range(3):
        labels = louvain(mean, seed)
        print(f"Louvain (seed {seed}): {labels.max() + 1} communities, "
              f"ARI {adjusted_rand_score(groups, labels):.2f}")
    filled = np.nan_to_num(mean, nan=float(np.nanmean(mean[pairs])))
    np.fill_diagonal(filled, 1.0)
    k = int(groups.max()) + 1
    labels = AgglomerativeClustering(k, metric="precomputed",
                                     linkage="average").fit_predict(1 - filled)
    print(f"average linkage given the true {k} groups: "
          f"ARI {adjusted_rand_score(groups, labels):.2f}")


if __name__ == "__main__":
    main()
