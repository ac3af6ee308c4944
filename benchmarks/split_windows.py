"""What the split statistics score on windows with and without groups: the figures behind the
README's account of the best-cut statistic (`kway_f`) against the bipartition's (`pseudo_f`).

1. Structureless updates, simulated: n isotropic Gaussian updates with random norms (no groups
   at all); both statistics over `--draws` draws per n. Both should sit near 1.
2. Real windows: grid cells (`benchmarks/grid.py`, seed 0) run with CFL kept from splitting
   (`max_clusters: 1`), so every window mixes all of the cell's groups; each closed window's
   two figures are read from the run's `metrics.jsonl` (from round `warmup_rounds` on, the
   windows CFL decides on).

    python benchmarks/split_windows.py                       # default cells, seed 0
    python benchmarks/split_windows.py --cells <name>,<name> --seed 1
    python benchmarks/split_windows.py --cells digits-rotation-g6-n43-s50-p11-r110 --twins

3. With `--twins`, each cell's IID twin too: the same datasets, clients, samples, participation,
   model and rounds with the hidden groups removed (`scenario: iid`). It answers whether a cell's
   windows score above what the same federation scores without groups, i.e. whether any bar
   on this statistic could split the cell and not its twin.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

import numpy as np

from fedflock.algorithms.cfl import CFLParams
from fedflock.clustering.bipartition import bipartition
from fedflock.clustering.split_stats import kway_pseudo_f, pseudo_f
from fedflock.experiment import run_experiment
from fedflock.validation import validate
from grid import draw_cells

# IID cells (no split wanted) and many-group cells (8 label permutations, 5 rotations)
DEFAULT_CELLS = ("mnist-iid-g1-n30-s142-p17-r71", "mnist-iid-g1-n62-s122-p21-r58",
                 "mnist5k-iid-g1-n107-s112-p6-r150", "mnist-iid-g1-n254-s187-p11-r110",
                 "mnist-label_permutation-g8-n65-s532-p19-r64",
                 "mnist-label_permutation-g8-n121-s419-p9-r134",
                 "mnist5k-rotation-g5-n168-s71-p26-r50", "mnist-rotation-g5-n164-s589-p5-r150")


def noise_scores(n: int, draws: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """(draws, 2): kway_f and pseudo_f of n structureless updates."""
    out = np.empty((draws, 2))
    for i in range(draws):
        x = rng.standard_normal((n, dim)) * rng.uniform(0.5, 2.0, size=(n, 1))
        unit = x / np.linalg.norm(x, axis=1, keepdims=True)
        sim = unit @ unit.T
        out[i] = kway_pseudo_f(sim)[0], pseudo_f(sim, bipartition(sim))
    return out


def window_scores(cell_name: str, seed: int, work: Path, twin: bool = False) -> np.ndarray:
    """(windows, 2): kway_f and pseudo_f of every closed window of an unsplit CFL run (of the
    cell's IID twin when `twin`)."""
    cell = next(c for c in draw_cells(60) if c.name == cell_name)
    raw = cell.config("cfl", seed)
    raw["algorithm"]["max_clusters"] = 1
    if twin:
        raw["data"]["scenario"] = {"kind": "iid", "groups": 1}
    where = work / f"{cell_name}{'-iid-twin' if twin else ''}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = validate(raw)
        run_experiment(config, where, quiet=True)
    warmup = CFLParams(**config.algorithm.params()).warmup_rounds
    rows = []
    for line in (where / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for cluster in record.get("clusters", []):
            if "kway_f" in cluster and record["round"] >= warmup:  # as CFL's decision
                rows.append(tuple(np.inf if cluster[key] is None else cluster[key]
                                  for key in ("kway_f", "pseudo_f")))  # JSON null: inf
    return np.array(rows).reshape(-1, 2)


def _summary(values: np.ndarray) -> str:
    if not len(values):
        return "no window"
    low, mid, high = np.percentile(values, [0, 50, 100])
    return f"{low:.2f} / {mid:.2f} / {high:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,30,100,300,1000")
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--dim", type=int, default=2000)
    parser.add_argument("--cells", default=",".join(DEFAULT_CELLS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--twins", action="store_true",
                        help="also score each cell's IID twin (the cell without its groups)")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print("| structureless updates, n | kway_f min / median / max | pseudo_f min / median / max |")
    print("|---|---|---|")
    for n in [int(s) for s in args.sizes.split(",")]:
        scores = noise_scores(n, args.draws, args.dim, rng)
        print(f"| {n} | {_summary(scores[:, 0])} | {_summary(scores[:, 1])} |")
    print("\n| cell (CFL, max_clusters 1) | windows | kway_f min / median / max "
          "| pseudo_f min / median / max |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cells.split(","):
            for twin in (False, True) if args.twins else (False,):
                scores = window_scores(name, args.seed, Path(tmp), twin)
                label = f"{name}, IID twin" if twin else name
                print(f"| {label} | {len(scores)} | {_summary(scores[:, 0])} | "
                      f"{_summary(scores[:, 1])} |", flush=True)


if __name__ == "__main__":
    main()
