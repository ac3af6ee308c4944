"""How sensitive is CFL's default split rule to its three settings?

The `auto` rule splits a cluster when the pseudo-F of the best cut of its min-max merge tree
(`split_statistic: kway`) exceeds `f_threshold` in each of its last `patience` windows after
`warmup_rounds` of FedAvg (under full participation, as here, a window is one round). This script
varies one setting at a time around the defaults (3.5, 3, 10) on scenarios with and without
hidden groups and prints, per setting, the ARI and the number of clusters found (mean over seeds),
so the working range is visible. Data ship with the dependencies (mnist5k, digits).

    .venv/bin/python benchmarks/split_rule_sensitivity.py --seeds 0,1 --rounds 40
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import numpy as np

from fedflock.experiment import run_experiment
from fedflock.validation import validate

SCENARIOS = {
    "mnist5k label_permutation K=4": ("mnist5k", {"kind": "label_permutation", "groups": 4}),
    "mnist5k rotation K=4": ("mnist5k", {"kind": "rotation", "groups": 4}),
    "digits label_swap K=2": ("digits", {"kind": "label_swap", "groups": 2}),
    "mnist5k iid": ("mnist5k", {"kind": "iid"}),
    "digits iid": ("digits", {"kind": "iid"}),
}
DEFAULTS = {"f_threshold": 3.5, "patience": 3, "warmup_rounds": 10}
GRID = {"f_threshold": [2.0, 2.5, 3.5, 5.0, 8.0], "patience": [1, 2, 3, 5],
        "warmup_rounds": [0, 5, 10, 20]}


def run(dataset: str, scenario: dict, algo: dict, seed: int, rounds: int) -> tuple[float, int]:
    raw = {
        "seed": seed, "rounds": rounds,
        "data": {"dataset": dataset, "clients": 20, "scenario": scenario,
                 **({"samples_per_client": 200, "test_per_client": 50}
                    if dataset == "mnist5k" else {})},
        "model": {"name": "mlp", "hidden": [100]},
        "training": {"local_epochs": 3, "lr": 0.1, "batch_size": 32},
        "algorithm": {"name": "cfl", **algo}, "checkpoint_every": rounds,
    }
    with tempfile.TemporaryDirectory() as tmp:
        summary = run_experiment(validate(raw), Path(tmp) / "r", quiet=True)
    return summary["ari"], summary["num_clusters"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    warnings.simplefilter("ignore")
    settings = [(k, v) for k, values in GRID.items() for v in values]
    header = "setting".ljust(18) + "".join(name.rjust(31) for name in SCENARIOS)
    print(f"ARI / clusters found (mean over seeds {seeds}, {args.rounds} rounds); defaults "
          f"{DEFAULTS}")
    print(header)
    for key, value in settings:
        algo = {**DEFAULTS, key: value}
        cells = []
        for dataset, scenario in SCENARIOS.values():
            results = [run(dataset, scenario, algo, s, args.rounds) for s in seeds]
            ari = float(np.mean([r[0] for r in results]))
            k = float(np.mean([r[1] for r in results]))
            cells.append(f"{ari:.2f} / {k:.1f}".rjust(31))
        mark = " *" if DEFAULTS[key] == value else ""
        print(f"{key}={value}{mark}".ljust(18) + "".join(cells), flush=True)


if __name__ == "__main__":
    main()
