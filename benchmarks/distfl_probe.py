"""Does DistFL's synthesis matter? Clustering quality with inputs optimised to match the BatchNorm
statistics (`steps: 200`) against plain Gaussian noise (`steps: 0`, what the authors' public code
ends up using), with the default rule (each client joined to its k nearest, k = round(ln n))
and with the paper's threshold 0.2.

Small and CPU-quick on purpose (scikit-learn digits, 8 clients in 2 groups, the small BN
ConvNet, 3 local epochs, clustering at round 4): a first look, not the paper's setting.

    python benchmarks/distfl_probe.py --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from fedflock.experiment import run_experiment
from fedflock.validation import validate


def config(kind: str, seed: int, steps: int, threshold: float | None) -> dict:
    return {
        "seed": seed, "rounds": 4, "checkpoint_every": 4,
        "data": {"dataset": "digits", "clients": 8, "samples_per_client": 150,
                 "test_per_client": 30, "scenario": {"kind": kind, "groups": 2}},
        "model": {"name": "cnn_bn"},
        "training": {"local_epochs": 3, "lr": 0.1, "batch_size": 16, "executor": "sequential"},
        "algorithm": {"name": "distfl", "warmup_rounds": 4, "synthetic": 200, "steps": steps,
                      "threshold": threshold},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--scenarios", default="feature_skew,label_permutation,rotation,iid")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print("| scenario | inputs | rule | ARI per seed | clusters per seed |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.scenarios.split(","):
            for steps, inputs in ((200, "synthesised"), (0, "noise")):
                for threshold in (None, 0.2):
                    aris, counts = [], []
                    for seed in seeds:
                        out = Path(tmp) / f"{kind}-{steps}-{threshold}-{seed}"
                        s = run_experiment(validate(config(kind, seed, steps, threshold)), out,
                                           quiet=True)
                        aris.append(f"{s['ari']:.2f}")
                        counts.append(str(s["num_clusters"]))
                    label = "k nearest" if threshold is None else f"threshold {threshold}"
                    print(f"| {kind} | {inputs} | {label} | {' / '.join(aris)} | "
                          f"{' / '.join(counts)} |", flush=True)


if __name__ == "__main__":
    main()
