"""How clustering grows with rounds under sparse participation (issue 4, acceptance 2).

Runs `configs/mnist_partial_1pct.yaml` (100 clients, ONE sampled per round) with the incremental
algorithm for each seed and prints, every `--every` rounds: the ARI of the whole partition (the
clients not yet placed count as one extra group), the ARI among the clients placed so far, and
how many clients are still waiting; then the round at which every client seen so far was
grouped correctly and the final ARI after the last round's placement.

    python benchmarks/ari_growth.py --seeds 0,1,2
    python benchmarks/ari_growth.py --runs runs/p1/incremental/seed0 ...   # existing run dirs
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

import numpy as np

from fedflock.experiment import run_experiment
from fedflock.validation import load_config


def load(run: Path) -> tuple[list[dict], dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    return records, json.loads((run / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/mnist_partial_1pct.yaml"))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--runs", type=Path, nargs="*", help="read these run directories")
    args = parser.parse_args()

    runs = list(args.runs or [])
    tmp = None
    if not runs:
        tmp = tempfile.TemporaryDirectory()
        for seed in (int(s) for s in args.seeds.split(",")):
            config = load_config(args.config, [f"seed={seed}", "algorithm.name=incremental"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run_experiment(config, Path(tmp.name) / f"seed{seed}", quiet=True)
            runs.append(Path(tmp.name) / f"seed{seed}")
    loaded = [load(r) for r in runs]
    rounds = len(loaded[0][0])

    print(f"{args.config}: {len(runs)} run(s); mean over runs")
    print("| round | ARI (all clients) | ARI (clients placed) | clients waiting |")
    print("|---|---|---|---|")
    for rnd in [*range(args.every, rounds + 1, args.every)]:
        recs = [records[rnd - 1] for records, _ in loaded]
        ari = np.mean([r["ari"] for r in recs])
        placed = [r.get("ari_placed", r["ari"]) for r in recs]
        placed = [p for p in placed if p is not None]
        waiting = np.mean([r.get("unplaced", 0) for r in recs])
        print(f"| {rnd} | {ari:.3f} | {np.mean(placed):.3f} | {waiting:.0f} |")
    for run, (records, summary) in zip(runs, loaded, strict=True):
        clustered = next((r for r in records if "modularity" in r), None)
        ok = next((r["round"] for r in records
                   if r.get("ari_placed", r["ari"]) == 1.0 and r["num_clusters"] > 1), None)
        print(f"{run.name}: clustered at round "
              f"{clustered['round'] if clustered else '-'} "
              f"({clustered['stored'] if clustered else 0} clients seen), placed clients "
              f"grouped correctly from round {ok}; final ARI {summary['ari']:.3f} after placing "
              f"the last {records[-1].get('unplaced', 0)} waiting clients; final accuracy "
              f"{summary['accuracy']['mean']:.3f}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
