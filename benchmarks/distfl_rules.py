"""Which rule should decide DistFL's clusters? Each run stops at its clustering round; the
divergence matrix it recorded (splits/split_00.npz and the decision's `scale`) is then
clustered offline by every rule, and each rule's partition is scored against the hidden groups.

Rules: the paper's fixed threshold 0.2; `factor` x the median nearest-neighbour divergence (a
scale-free threshold); the union k-NN graph with k = round(ln n) (fedflock's default).

    python benchmarks/distfl_rules.py                      # digits 8 and 20 clients, seeds 0-5
    python benchmarks/distfl_rules.py --dataset mnist --clients 50 --samples 200 \
        --rounds 5 --epochs 1 --lr 0.05 --seeds 0,1,2,3 \
        --scenarios iid,category_imbalance,label_permutation,feature_skew

An IID run scores 1 when the rule keeps it whole, 0 otherwise; a run with groups scores its ARI.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
from sklearn.metrics import adjusted_rand_score

from fedflock.clustering.threshold import (
    default_neighbours,
    neighbour_components,
    threshold_components,
)
from fedflock.experiment import run_experiment
from fedflock.validation import validate

Rule = Callable[[np.ndarray], list[list[int]]]


def _median_nn(d: np.ndarray) -> float:
    return float(np.median((d + np.diag(np.full(len(d), np.inf))).min(axis=1)))


RULES: dict[str, Rule] = {
    "threshold 0.2 (paper)": lambda d: threshold_components(d, 0.2),
    "3 x median NN": lambda d: threshold_components(d, 3 * _median_nn(d)),
    "k-NN, k = round(ln n)": lambda d: neighbour_components(d, default_neighbours(len(d))),
}


def _config(args: argparse.Namespace, kind: str, seed: int) -> dict:
    groups = 1 if kind == "iid" else (5 if kind == "category_imbalance"
                                      else max(2, min(4, args.clients // 5)))
    return {
        "seed": seed, "rounds": args.rounds, "checkpoint_every": args.rounds,
        "data": {"dataset": args.dataset, "clients": args.clients,
                 "samples_per_client": args.samples, "test_per_client": 30,
                 "scenario": {"kind": kind, "groups": groups}},
        "model": {"name": "cnn_bn"},
        "training": {"local_epochs": args.epochs, "lr": args.lr, "batch_size": 16},
        "algorithm": {"name": "distfl", "warmup_rounds": args.rounds, "synthetic": 200},
    }


def _divergence(run: Path) -> tuple[np.ndarray, np.ndarray]:
    """The clustering round's divergence (from the stored affinity and its scale) and the
    hidden groups of the clients in its rows."""
    summary = json.loads((run / "summary.json").read_text())
    scale = summary["splits"][0]["scale"]
    with np.load(run / "splits" / "split_00.npz") as saved:
        members = saved["members"]
        with np.errstate(divide="ignore"):
            divergence = -np.log(saved["similarity"]) * scale
    return divergence, np.asarray(summary["true_groups"])[members]


def _score(groups: np.ndarray, parts: list[list[int]]) -> tuple[float, int]:
    labels = np.empty(len(groups), dtype=int)
    for k, part in enumerate(parts):
        labels[part] = k
    if len(set(groups.tolist())) == 1:
        return float(len(parts) == 1), len(parts)
    return float(adjusted_rand_score(groups, labels)), len(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--samples", type=int, default=80)
    parser.add_argument("--rounds", type=int, default=4, help="warm-up rounds (clustering at "
                        "the last)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seeds", default="0,1,2,3,4,5")
    parser.add_argument("--scenarios",
                        default="iid,label_permutation,feature_skew,rotation,category_imbalance")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"{args.dataset}, {args.clients} clients x {args.samples} samples, clustering at "
          f"round {args.rounds}, seeds {args.seeds}; score per seed (IID: 1 = kept whole; "
          f"else ARI) / clusters")
    print("| scenario | rule | per seed | mean |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.scenarios.split(","):
            scores: dict[str, list[tuple[float, int]]] = {name: [] for name in RULES}
            for seed in seeds:
                run = Path(tmp) / f"{kind}-{seed}"
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    run_experiment(validate(_config(args, kind, seed)), run, quiet=True)
                divergence, groups = _divergence(run)
                for name, rule in RULES.items():
                    scores[name].append(_score(groups, rule(divergence)))
            for name, values in scores.items():
                cells = " ".join(f"{s:.2f}/{k}" for s, k in values)
                print(f"| {kind} | {name} | {cells} | {np.mean([s for s, _ in values]):.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
