"""Does a change leave the published runs as they were? Run one declared set of experiments
from two source trees and compare their summaries, minus timings.

    git worktree add /tmp/before <commit>
    python benchmarks/same_summaries.py run --tree /tmp/before --out runs/same/before
    python benchmarks/same_summaries.py run --tree . --out runs/same/after
    python benchmarks/same_summaries.py diff runs/same/before runs/same/after

Each experiment is a published command (README, *Results*) run from the tree's own files with
that tree's `src` first on the import path; `--quick` shortens the longer ones (same code
paths, fewer rounds). `diff` walks every `summary.json` under the first folder and reports any
value that differs in the second (exit status 1), ignoring the keys that measure time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

GRID_CELLS = ("digits-label_swap-g7-n39-s110-p6-r150,mnist5k-label_permutation-g5-n40-s85-p40-r50,"
              "digits-rotation-g6-n43-s50-p11-r110,mnist-feature_skew-g4-n39-s87-p26-r50,"
              "mnist-iid-g1-n30-s142-p17-r71,mnist5k-feature_skew-g3-n38-s315-p40-r50,"
              "digits-label_swap-g5-n53-s81-p94-r50,mnist5k-rotation-g6-n53-s96-p16-r75")
PARTIAL = "configs/mnist_partial_label_permutation.yaml"


def experiments(quick: bool) -> dict[str, list[str]]:
    """name -> command (run in the tree's root; `{out}` is the experiment's folder)."""
    rounds = ["--set", "rounds=30"] if quick else []
    run = ["-m", "fedflock", "run"]
    return {
        "grid": ["benchmarks/grid.py", "--only", GRID_CELLS, "--seeds", "0", "--out", "{out}"],
        "partial-10pct-incremental": [*run, PARTIAL, "--set", "algorithm.name=incremental",
                                      *rounds, "--out", "{out}"],
        "partial-10pct-cfl": [*run, PARTIAL, "--set", "algorithm.name=cfl", *rounds,
                              "--out", "{out}"],
        "partial-1pct-incremental": [*run, "configs/mnist_partial_1pct.yaml", *rounds,
                                     "--out", "{out}"],
        "poisoning-60pct-incremental": [*run, "configs/mnist_attack_sign_flip.yaml",
                                        "--set", "attack.fraction=0.6", *rounds,
                                        "--out", "{out}"],
        "scale-sketch-neighbours": [*run, PARTIAL, "--set", "algorithm.name=incremental",
                                    "--set", "algorithm.sketch=512",
                                    "--set", "algorithm.neighbours=8", "--set", "rounds=40",
                                    "--out", "{out}"],
        "cfl-eps-gradients": [*run, "configs/digits_label_permutation.yaml",
                              "--set", "algorithm.split_rule=eps",
                              "--set", "algorithm.eps1=0.4", "--set", "algorithm.eps2=0.6",
                              "--set", "algorithm.update=gradients", "--out", "{out}"],
        "ifca": [*run, "configs/mnist_label_permutation.yaml", "--set", "algorithm.name=ifca",
                 "--set", "algorithm.clusters=4", "--set", "rounds=30", "--out", "{out}"],
        "distfl": [*run, "configs/mnist_category_imbalance.yaml", "--set",
                   "algorithm.name=distfl", *rounds, "--out", "{out}"],
    }


def run(tree: Path, out: Path, quick: bool, only: list[str] | None) -> None:
    env = os.environ | {"PYTHONPATH": str(tree.resolve() / "src"), "OMP_NUM_THREADS": "1"}
    for name, command in experiments(quick).items():
        if only and name not in only:
            continue
        folder = (out / name).resolve()
        if (folder / "summary.json").exists() or (folder / "results.jsonl").exists():
            print(f"{name}: already there")
            continue
        argv = [sys.executable, *[a.replace("{out}", str(folder)) for a in command]]
        print(f"{name}: {' '.join(argv[1:])}", flush=True)
        subprocess.run(argv, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)


TIMING = ("timing", "seconds", "wall", "per_second", "rss", "elapsed")  # keys that measure time


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON values differ, ignoring the keys that measure time."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if any(t in key for t in TIMING):
                continue
            if key not in a or key not in b:
                out.append(f"{path}/{key}: only in {'after' if key in b else 'before'}")
            else:
                out.extend(differences(a[key], b[key], f"{path}/{key}"))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:80]} != {str(b)[:80]}"]


def diff(before: Path, after: Path) -> int:
    found = 0
    summaries = sorted(before.rglob("summary.json"))
    for summary in summaries:
        other = after / summary.relative_to(before)
        if not other.exists():
            print(f"{summary.relative_to(before)}: missing after")
            found += 1
            continue
        lines = differences(json.loads(summary.read_text()), json.loads(other.read_text()))
        for line in lines:
            print(f"{summary.relative_to(before)}{line}")
        found += bool(lines)
    print(f"{len(summaries)} summaries compared, {found} differ")
    return 1 if found else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    runs = sub.add_parser("run")
    runs.add_argument("--tree", type=Path, default=Path("."))
    runs.add_argument("--out", type=Path, required=True)
    runs.add_argument("--quick", action="store_true")
    runs.add_argument("--only", default=None, help="comma-separated experiment names")
    compare = sub.add_parser("diff")
    compare.add_argument("before", type=Path)
    compare.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.tree, args.out, args.quick, args.only.split(",") if args.only else None)
    else:
        sys.exit(diff(args.before, args.after))


if __name__ == "__main__":
    main()
