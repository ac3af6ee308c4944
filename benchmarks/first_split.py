"""How few samples per client does CFL need to split two label-swap groups correctly?

Runs CFL with its default (self-calibrating) split rule on 20 clients in 2 hidden label-swap groups
for several per-client sample counts and seeds, and prints, per count, whether a first split
happened, whether its parts are the true groups, and in which round. The CFL
paper reports a correct first split from 20 samples per client on MNIST.

    FEDFLOCK_DATA=../shared/data .venv/bin/python benchmarks/first_split.py \
        --samples 20,30,50,100,200 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

from fedflock.experiment import run_experiment
from fedflock.validation import validate


def first_split_correct(summary: dict) -> tuple[bool, bool, int | None]:
    """(split happened, the parts of the first split are the true groups, its round). The
    first split may cut into more than two parts (`split_into: cut`): it is correct when each
    part holds one group and no group is in two parts."""
    if not summary["splits"]:
        return False, False, None
    first = summary["splits"][0]
    groups = summary["true_groups"]
    held = [{groups[c] for c in part} for part in first["members"]]
    correct = all(len(h) == 1 for h in held) and len(set().union(*held)) == len(held)
    return True, correct, first["round"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--samples", default="20,30,50,100,200")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    for n in [int(x) for x in args.samples.split(",")]:
        outcomes = []
        for seed in [int(x) for x in args.seeds.split(",")]:
            raw = {
                "seed": seed, "rounds": args.rounds,
                "data": {"dataset": args.dataset, "clients": 20, "samples_per_client": n,
                         "test_per_client": 50,
                         "scenario": {"kind": "label_swap", "groups": 2}},
                "model": {"name": "mlp", "hidden": [100]},
                "training": {"local_epochs": 3, "lr": 0.1, "batch_size": 32},
                "algorithm": {"name": "cfl"},
                "checkpoint_every": args.rounds,
            }
            with tempfile.TemporaryDirectory() as tmp:
                summary = run_experiment(validate(raw), Path(tmp) / "run", quiet=True)
            outcomes.append(first_split_correct(summary))
        rows.append({"samples": n, "outcomes": outcomes})
        split = sum(o[0] for o in outcomes)
        correct = sum(o[1] for o in outcomes)
        rounds = [o[2] for o in outcomes]
        print(f"samples/client {n:4d}: split on {split}/{len(outcomes)} seeds, first split "
              f"correct on {correct}/{len(outcomes)}, first-split rounds {rounds}", flush=True)
    ok = [r["samples"] for r in rows if all(o[1] for o in r["outcomes"])]
    print(f"smallest count with a correct first split on every seed: {min(ok) if ok else None}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
