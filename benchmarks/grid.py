"""The clustering methods on a broad scenario grid, one default config per method, no per-cell
tuning: does one default hold where the README's examples do not reach?

A seeded draw of cells covers datasets (mnist, mnist5k, digits), scenarios (label_permutation,
label_swap, rotation, feature_skew, iid), 2-8 groups, 30-300 clients, 50-600 samples per client
and 5%-100% participation (log-uniform where the range spans a factor of ten); `--femnist`
cells (default 6) add FEMNIST with one client per writer, a control with no hidden groups like
the IID cells (a draw of their own: the other cells do not move). Every cell runs
each algorithm with its defaults, plus FedAvg and the oracle (FedAvg inside each true group) for
reference, over the seeds given. Rounds: enough for every client to be sampled about 12 times,
between 50 and 150. Final-round mean accuracy and ARI against the hidden groups.

    python benchmarks/grid.py --cells 60 --seeds 0            # choose defaults on these
    python benchmarks/grid.py --cells 60 --seeds 1,2          # report these
    python benchmarks/grid.py --list                           # the cells, nothing run

Each run's summary lands in --out/<cell>/<algorithm>/seed<k>; `results.jsonl` gets one line per
run, and a run already there is not repeated, so an interrupted grid resumes where it stopped.
Acceptance lines at the end: among the cells where the oracle beats FedAvg by at least 5
points, the share with ARI >= 0.95 per method, and every IID cell a method split.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedflock.experiment import run_experiment
from fedflock.validation import validate

SCENARIOS = ("label_permutation", "label_swap", "rotation", "feature_skew", "iid")
NO_GROUPS = ("iid", "natural")  # controls: no hidden groups, a split is not wanted
FEMNIST_WRITERS = 105  # writers with training data in the shared FEMNIST sample (the draw keeps
# well below it: a cell needs that many writers with test data too)
MAX_GROUPS = {"feature_skew": 5}  # one distinct transform per group
# most clients x samples drawn from each training pool (60,000 / 4,000 / 1,437): digits and
# mnist5k reuse samples above their pool, which the data layer allows with a warning; capped
# so reuse stays below 3x
MAX_DRAWS = {"mnist": 180_000, "mnist5k": 12_000, "digits": 4_300}
DATASET_WEIGHTS = {"mnist": 0.6, "mnist5k": 0.2, "digits": 0.2}
REFERENCES = ("fedavg", "oracle")
GOOD_ARI = 0.95
GAIN = 0.05  # the oracle must beat FedAvg by this much for a cell to count


@dataclass(frozen=True)
class Cell:
    dataset: str
    scenario: str
    groups: int
    clients: int
    samples: int
    participation: float

    @property
    def name(self) -> str:
        return (f"{self.dataset}-{self.scenario}-g{self.groups}-n{self.clients}"
                f"-s{self.samples}-p{round(100 * self.participation)}-r{self.rounds}")

    @property
    def rounds(self) -> int:
        return int(min(150, max(50, math.ceil(12 / self.participation))))

    def config(self, algorithm: str, seed: int) -> dict[str, Any]:
        scenario = ({"kind": "natural"} if self.scenario == "natural"
                    else {"kind": self.scenario, "groups": self.groups})
        return {
            "seed": seed,
            "rounds": self.rounds,
            "data": {"dataset": self.dataset, "clients": self.clients,
                     "samples_per_client": self.samples, "test_per_client": 50,
                     "scenario": scenario},
            "model": {"name": "mlp", "hidden": [100]},
            "training": {"local_epochs": 2, "lr": 0.1, "batch_size": 32,
                         "executor": "sequential"},
            "participation": {"fraction": self.participation},
            "algorithm": {"name": algorithm},
            "eval_every": self.rounds,
            "checkpoint_every": self.rounds,
        }


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(np.exp(rng.uniform(np.log(low), np.log(high))))


def draw_cells(count: int, seed: int = 13) -> list[Cell]:
    """`count` cells drawn once from the ranges (the draw never looks at any result)."""
    rng = np.random.default_rng(seed)
    names = list(DATASET_WEIGHTS)
    cells = []
    while len(cells) < count:
        dataset = str(rng.choice(names, p=list(DATASET_WEIGHTS.values())))
        scenario = SCENARIOS[len(cells) % len(SCENARIOS)]  # every scenario equally often
        groups = 1 if scenario == "iid" else int(rng.integers(2, MAX_GROUPS.get(scenario, 8) + 1))
        clients = round(_log_uniform(rng, 30, 300))
        samples = round(_log_uniform(rng, 50, 600))
        samples = max(50, min(samples, MAX_DRAWS[dataset] // clients))
        participation = round(_log_uniform(rng, 0.05, 1.0), 2)
        if clients < 4 * groups or clients * samples > MAX_DRAWS[dataset]:
            continue  # too few clients per group, or a pool reused more than 3 times
        cells.append(Cell(dataset, scenario, groups, clients, samples, participation))
    return cells


def draw_femnist_cells(count: int, seed: int = 14) -> list[Cell]:
    """`count` FEMNIST cells, one client per writer (no hidden groups: writers differ in style,
    not in what a character means), drawn from the same ranges as `draw_cells` with clients
    capped by the writers there are; each writer keeps `samples` of its training samples (a
    subset seeded by its id, see `data.scenarios`).
    A draw of its own, so the other cells do not move."""
    rng = np.random.default_rng(seed)
    cells = []
    for _ in range(count):
        clients = round(_log_uniform(rng, 30, FEMNIST_WRITERS))
        samples = round(_log_uniform(rng, 50, 600))
        participation = round(_log_uniform(rng, 0.05, 1.0), 2)
        cells.append(Cell("femnist", "natural", 1, clients, samples, participation))
    return cells


def _done(results: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    if not results.exists():
        return {}
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    return {(r["cell"], r["algorithm"], r["seed"]): r for r in rows}


def _check_same_params(done: dict[tuple[str, str, int], dict[str, Any]], methods: list[str],
                       overrides: dict[str, Any], results: Path) -> None:
    """A row already in `results` is skipped, so it must come from the same --params (a trial
    written beside default rows would otherwise keep them without a word); exit 2 if not."""
    for (cell, algorithm, seed), row in done.items():
        recorded = {k: v for k, v in row.get("params", {}).items() if k != "note"}
        if algorithm in methods and recorded != overrides.get(algorithm, {}):
            print(f"grid.py: {results} holds {cell} {algorithm} seed {seed} run with params "
                  f"{recorded or 'default'}, not {overrides.get(algorithm) or 'default'}: "
                  "use another --out", file=sys.stderr)
            raise SystemExit(2)



def run_cell(cell: Cell, algorithm: str, seed: int, out: Path, overrides: dict[str, Any]
             ) -> dict[str, Any]:
    raw = cell.config(algorithm, seed)
    changed = overrides.get(algorithm, {})
    raw["algorithm"].update(changed)
    where = out / cell.name / algorithm / f"seed{seed}"
    shutil.rmtree(where, ignore_errors=True)  # a run interrupted before its result line
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = run_experiment(validate(raw), where, quiet=True)
    return {"cell": cell.name, **asdict(cell), "rounds": cell.rounds, "algorithm": algorithm,
            "seed": seed, "accuracy": summary["accuracy"]["mean"], "ari": summary.get("ari"),
            "clusters": summary["num_clusters"],
            "splits": len(summary.get("splits", [])),
            "seconds": round(time.perf_counter() - start, 1)} | (
                {"params": changed} if changed else {})  # a trial's rows say what it changed


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(values)) if values else float("nan")


def report(cells: list[Cell], done: dict[tuple[str, str, int], dict[str, Any]],
           methods: list[str], seeds: list[int]) -> None:
    print(f"\n{len(cells)} cells, seeds {seeds}; accuracy % (mean over seeds), ARI (min over "
          "seeds), clusters (per seed)")
    head = "| cell | rounds | fedavg | oracle | " + " | ".join(methods) + " |"
    print(head + "\n" + "|---" * (4 + len(methods)) + "|")
    counted = {m: [0, 0] for m in methods}  # cells where clustering pays: [good, all]
    iid_splits: dict[str, list[str]] = {m: [] for m in methods}
    failures: dict[str, list[str]] = {m: [] for m in methods}
    for cell in cells:
        got = {a: [done[cell.name, a, s] for s in seeds if (cell.name, a, s) in done]
               for a in [*REFERENCES, *methods]}
        if not all(got.values()):
            continue
        fedavg, oracle = _mean(got["fedavg"], "accuracy"), _mean(got["oracle"], "accuracy")
        control = cell.scenario in NO_GROUPS
        pays = not control and oracle - fedavg >= GAIN
        entries = []
        for m in methods:
            rows = got[m]
            ari = None if control else min(r["ari"] for r in rows)
            clusters = "/".join(str(r["clusters"]) for r in rows)
            entries.append(f"{100 * _mean(rows, 'accuracy'):.1f} "
                           + (f"(ARI {ari:.2f}, k {clusters})" if ari is not None
                              else f"(k {clusters})"))
            if pays:
                counted[m][1] += 1
                if ari >= GOOD_ARI:
                    counted[m][0] += 1
                else:
                    failures[m].append(f"{cell.name} (ARI {ari:.2f}, k {clusters})")
            if control and any(r["clusters"] > 1 for r in rows):
                iid_splits[m].append(f"{cell.name} (k {clusters})")
        mark = "" if pays or control else " (oracle gain < 5)"
        print(f"| {cell.name}{mark} | {cell.rounds} | {100 * fedavg:.1f} | {100 * oracle:.1f} | "
              + " | ".join(entries) + " |")
    print()
    for m in methods:
        good, total = counted[m]
        share = f"{100 * good / total:.0f}%" if total else "–"
        print(f"{m}: ARI >= {GOOD_ARI} on {good} of {total} cells where the oracle gains >= 5 "
              f"points ({share}); IID / natural cells split: {len(iid_splits[m])}")
        for line in failures[m] + [f"no-group cell split: {c}" for c in iid_splits[m]]:
            print(f"  - {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=60)
    parser.add_argument("--femnist", type=int, default=6,
                        help="FEMNIST writer cells added to the drawn ones (no hidden groups)")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--methods", default="incremental,cfl")
    parser.add_argument("--only", default=None, help="comma-separated cell names to run")
    parser.add_argument("--params", default="{}", help="JSON {algorithm: {param: value}} "
                        "applied to every cell (a default being tried; never per cell)")
    parser.add_argument("--out", type=Path, default=Path("runs/grid"))
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per run (a result depends on it through float "
                        "rounding; the committed rows use 1)")
    parser.add_argument("--list", action="store_true", help="print the cells and stop")
    parser.add_argument("--report", action="store_true", help="only print the table of the "
                        "runs already done")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # 1: many small models, more threads only contend
    seeds = [int(s) for s in args.seeds.split(",")]
    methods = args.methods.split(",")
    cells = draw_cells(args.cells) + draw_femnist_cells(args.femnist)
    if args.only:
        wanted = set(args.only.split(","))
        cells = [c for c in cells if c.name in wanted]
    if args.list:
        for cell in cells:
            print(cell.name, cell.rounds)
        return
    overrides = json.loads(args.params)
    results = args.out / "results.jsonl"
    results.parent.mkdir(parents=True, exist_ok=True)
    done = _done(results)
    start = time.perf_counter()
    if not args.report:
        _check_same_params(done, methods, overrides, results)
        for cell in cells:
            for algorithm in [*REFERENCES, *methods]:
                for seed in seeds:
                    if (cell.name, algorithm, seed) in done:
                        continue
                    row = run_cell(cell, algorithm, seed, args.out, overrides)
                    done[cell.name, algorithm, seed] = row
                    with results.open("a") as fh:
                        fh.write(json.dumps(row) + "\n")
                    print(f"{cell.name} {algorithm} seed {seed}: {100 * row['accuracy']:.1f}% "
                          f"ARI {row['ari']} k {row['clusters']} ({row['seconds']} s)",
                          flush=True)
    report(cells, done, methods, seeds)
    print(f"\nwall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
