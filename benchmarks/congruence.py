"""Do a scenario's groups all need their own model? The grid's feature_skew cells, measured.

The grid (`benchmarks/grid.py`) scores a method by its ARI against the scenario's groups. That
presumes every group needs its own model. feature_skew gives each group one input transform
(none, invert, noise, brightness, contrast); if one model fits several of them, splitting
those groups buys no accuracy and no update-based method can be asked to find them. This
script measures it instead of assuming it: for each feature_skew cell of 3 or more groups it
runs the oracle a second time on a coarser partition (the invert group alone, every other
group together) and reports its final accuracy beside the full oracle's, and the ARI of each
method's final clusters against both partitions (read from the grid's run directories).

    python benchmarks/congruence.py --seed 0 --runs runs/grid --out runs/congruence.jsonl \\
        --results benchmarks/results/tables/scenario-grid.jsonl

`--acceptance ROWS` runs nothing: from the grid's rows and these rows it prints the issue's
acceptance count (paying cells at ARI >= 0.95) under both yardsticks, each feature_skew cell
of 3 or more groups scored against its groups and against {invert, rest}:

    python benchmarks/congruence.py --seed 1 \\
        --results benchmarks/results/tables/scenario-grid.jsonl \\
        --acceptance benchmarks/results/tables/scenario-grid-congruence.jsonl

A trial's counts: its rows after the defaults' (`--results grid-seed1.jsonl,<trial rows>`)
and its congruence rows, made from its run folders with `--coarse-from` the defaults' rows
(the coarse oracle does not depend on the method, so it is not run again).
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score

from fedflock.config import ScenarioConfig
from fedflock.experiment import run_experiment
from fedflock.validation import validate
from grid import GAIN, GOOD_ARI, draw_cells

METHODS = ("incremental", "cfl")
# the group the grid's feature_skew cells give the invert transform (they keep the defaults)
INVERT_GROUP = ScenarioConfig.model_fields["transforms"].default_factory().index("invert")


def _summary(runs: list[Path], cell: str, algorithm: str, seed: int) -> dict | None:
    for root in runs:
        path = root / cell / algorithm / f"seed{seed}" / "summary.json"
        if path.exists():
            return json.loads(path.read_text())
    return None


def _labels(clusters: list[list[int]], n: int) -> np.ndarray:
    labels = np.empty(n, dtype=int)
    for k, members in enumerate(clusters):
        labels[members] = k
    return labels


def coarse_oracle(cell, seed: int, groups: np.ndarray, work: Path) -> float:
    """Final accuracy of FedAvg inside {invert group} and {all other groups} (a run already in
    `work` is read, not repeated)."""
    done = work / cell.name / "summary.json"
    if done.exists():
        return json.loads(done.read_text())["accuracy"]["mean"]
    raw = cell.config("oracle", seed)
    raw["algorithm"]["clusters"] = [np.flatnonzero(groups == INVERT_GROUP).tolist(),
                                    np.flatnonzero(groups != INVERT_GROUP).tolist()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_experiment(validate(raw), work / cell.name, quiet=True)
    return json.loads(done.read_text())["accuracy"]["mean"]


def acceptance(grid_rows: list[dict], congruence_rows: list[dict], seed: int) -> None:
    """Print, per method: paying cells (the oracle beats FedAvg by >= 5 points), those at
    ARI >= 0.95 against the groups, and those at ARI >= 0.95 when every feature_skew cell of
    `congruence_rows` is scored against {invert, rest} instead."""
    runs = {(r["cell"], r["algorithm"]): r for r in grid_rows if r.get("seed") == seed}
    if not runs:
        raise SystemExit(f"error: no grid rows of seed {seed}")
    coarse = {r["cell"]: r for r in congruence_rows if r.get("seed") == seed}
    paying = sorted({cell for cell, _ in runs
                     if (cell, "oracle") in runs and (cell, "fedavg") in runs and
                     runs[cell, "oracle"]["accuracy"] - runs[cell, "fedavg"]["accuracy"]
                     >= GAIN})
    print("| method | paying cells | ARI >= 0.95 | feature_skew against {invert, rest} |")
    print("|---|---|---|---|")
    for method in METHODS:
        cells = [c for c in paying if (c, method) in runs]
        found = sum(runs[c, method]["ari"] >= GOOD_ARI for c in cells)
        needed = sum((coarse[c][method]["ari_coarse"] if method in coarse.get(c, {})
                      else runs[c, method]["ari"]) >= GOOD_ARI for c in cells)
        print(f"| {method} | {len(cells)} | {found} | {needed} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", default=None,
                        help="comma-separated grid output folders holding the methods' runs")
    parser.add_argument("--results", required=True,
                        help="a grid results.jsonl with the cells' fedavg and oracle rows "
                        "(comma-separated files: a later file's row of a run replaces an "
                        "earlier one's, e.g. a trial's rows after the defaults')")
    parser.add_argument("--work", default="runs/congruence")
    parser.add_argument("--out", default=None, help="append one JSON line per cell here")
    parser.add_argument("--acceptance", type=Path, default=None,
                        help="rows of earlier runs of this script: print the acceptance counts")
    parser.add_argument("--coarse-from", type=Path, default=None,
                        help="rows of earlier runs of this script: take each cell's coarse "
                        "oracle from them instead of running it (it does not depend on the "
                        "methods)")
    args = parser.parse_args()
    # as the grid's rows: a small cell's accuracy moves by points with float rounding alone
    # (mnist-feature_skew-g4-n39, seed 0, coarse oracle: 78.9% on 1 thread, 82.1% on 2)
    torch.set_num_threads(1)
    rows = [json.loads(line) for path in args.results.split(",")
            for line in Path(path).read_text().splitlines()]
    if args.acceptance is not None:
        acceptance(rows, [json.loads(line) for line in
                          args.acceptance.read_text().splitlines()], args.seed)
        return
    if args.runs is None:
        parser.error("--runs is needed unless --acceptance is given")
    runs = [Path(p) for p in args.runs.split(",")]
    work = Path(args.work) / f"seed{args.seed}"
    reference = {(r["cell"], r["algorithm"]): r["accuracy"] for r in rows
                 if r["seed"] == args.seed}
    unsplit = {(r["cell"], r["algorithm"]) for r in rows
               if r["seed"] == args.seed and r.get("clusters") == 1}
    earlier = {} if args.coarse_from is None else {
        r["cell"]: r["oracle_coarse"] for r in map(json.loads, args.coarse_from.read_text(
        ).splitlines()) if r.get("seed") == args.seed}
    print("| cell | fedavg | oracle | oracle, invert vs rest | "
          + " | ".join(f"{m}: ARI groups / coarse" for m in METHODS) + " |")
    print("|---|---|---|---|" + "---|" * len(METHODS))
    for cell in draw_cells(60):
        if cell.scenario != "feature_skew" or cell.groups < 3:
            continue
        found = {m: _summary(runs, cell.name, m, args.seed) for m in METHODS}
        known = [s for s in found.values() if s is not None]
        never_split = all((cell.name, m) in unsplit for m in METHODS) and cell.name in earlier
        if (not known and not never_split) or (cell.name, "oracle") not in reference:
            print(f"| {cell.name} | (runs missing) |")
            continue
        row = {"cell": cell.name, "seed": args.seed,
               "fedavg": reference[cell.name, "fedavg"],
               "oracle": reference[cell.name, "oracle"]}
        if known:
            groups = np.asarray(known[0]["true_groups"])
            coarse = (groups == INVERT_GROUP).astype(int)
        row["oracle_coarse"] = earlier[cell.name] if cell.name in earlier \
            else coarse_oracle(cell, args.seed, groups, work)
        shown = []
        for method, run in found.items():
            if run is None and (cell.name, method) in unsplit:  # a row copied from a run
                row[method] = {"ari": 0.0, "ari_coarse": 0.0, "clusters": 1,  # that never split
                               "accuracy": reference[cell.name, method]}
                shown.append(f"0.00 / 0.00 (k 1, {100 * row[method]['accuracy']:.1f}%)")
                continue
            if run is None:
                shown.append("–")
                continue
            labels = _labels(run["clusters"], len(groups))
            row[method] = {"ari": adjusted_rand_score(groups, labels),
                           "ari_coarse": adjusted_rand_score(coarse, labels),
                           "accuracy": run["accuracy"]["mean"],
                           "clusters": len(run["clusters"])}
            shown.append(f"{row[method]['ari']:.2f} / {row[method]['ari_coarse']:.2f} "
                         f"(k {len(run['clusters'])}, {100 * run['accuracy']['mean']:.1f}%)")
        print(f"| {cell.name} | {100 * row['fedavg']:.1f} | {100 * row['oracle']:.1f} | "
              f"{100 * row['oracle_coarse']:.1f} | " + " | ".join(shown) + " |", flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
