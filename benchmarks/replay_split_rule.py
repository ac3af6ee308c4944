"""Which grid runs would another split rule (`f_threshold`, `patience`, `votes`) change?

A run with another rule is the run made until the first closed window the two rules judge
differently: they agree on every earlier window, and everything else in a run is seeded. Each
run's `metrics.jsonl` logs every closed window's statistic per cluster, so replaying both rules
on them says which runs must be re-run and which would come out identical; an identical run's
row is copied, marked `"replayed": true`. (CFL counts a window only from `warmup_rounds` on, as
`CFL.partition` does; incremental clustering counts every window it logs.) The replay says
nothing about a run after its first divergence: those must be run.

    python benchmarks/replay_split_rule.py --runs runs/grid2 --results runs/grid2/results.jsonl \
        --seed 2 --votes 2 --out runs/g2votes      # rows for runs that cannot change + a list
    python benchmarks/replay_split_rule.py ... --f-threshold 2.5   # which runs a lower bar moves

(`patience` cannot be replayed: it also decides when a window may span rounds, and when
incremental clusters, so it changes the windows themselves.)

The printed `--only` list is what `grid.py --params '{"cfl": {"votes": 2}}'` must still run
(per method); `--show` prints each diverging run's round and the cell's kind (an IID cell
listed there may split under the new rule). `--check TRIALS` compares the verdicts with full
re-runs already made: a run the replay calls unchanged must have the run's accuracy and ARI.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from fedflock.algorithms import validate_params
from fedflock.clustering.split_stats import SCORE_FIGURE
from fedflock.clustering.watch import split_vote
from fedflock.config import AlgorithmConfig
from fedflock.errors import ConfigError

METHODS = ("cfl", "incremental")
ROUNDING = 5e-5  # metrics.jsonl logs the statistics to 4 decimals


def first_divergence(metrics: Path, algorithm: str, params: Any, candidate: Any
                     ) -> int | None:
    """The first round whose window the run's rule (`params`) and the `candidate` parameters
    judge differently (None: the runs agree). A logged score within its rounding of either
    threshold counts as a divergence: the run compared the unrounded value."""
    if getattr(params, "split_rule", "auto") == "eps":
        return None  # the eps rule does not read f_threshold, patience or votes
    warmup = params.warmup_rounds if algorithm == "cfl" else 0
    scores: dict[int, list[float]] = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        for cluster in row.get("clusters", []):
            score = cluster.get(SCORE_FIGURE[params.split_statistic])
            if score is None or row["round"] < warmup:
                continue
            recent = scores.setdefault(cluster["id"], [])
            recent.append(score)
            near = min(abs(score - p.f_threshold) for p in (params, candidate)) <= ROUNDING
            if near or len({split_vote(recent, p.f_threshold, p.patience, p.votes)
                            for p in (params, candidate)}) > 1:
                return row["round"]
    return None


def _params(run: Path, changed: dict[str, Any]) -> tuple[Any, Any]:
    """The run's algorithm parameters, and the same with `changed` (validated alike)."""
    raw = yaml.safe_load((run / "config.yaml").read_text())["algorithm"]
    return (validate_params(AlgorithmConfig.model_validate(raw)),
            validate_params(AlgorithmConfig.model_validate(raw | changed)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, required=True, help="a grid.py --out folder")
    parser.add_argument("--results", type=Path, required=True, help="its default rows")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--votes", type=int, default=None, help="the rule's votes (default: "
                        "the run's)")
    parser.add_argument("--f-threshold", type=float, default=None,
                        help="the rule's threshold (default: the run's)")
    parser.add_argument("--show", action="store_true", help="print every diverging run")
    parser.add_argument("--out", type=Path, default=None, help="write the unchanged runs' "
                        "rows to OUT/<method>/results.jsonl, appended (grid.py then skips "
                        "them); patience is not replayable: it also sets when a window may "
                        "span rounds")
    parser.add_argument("--check", type=Path, nargs="*", default=[],
                        help="trial rows of full re-runs with these votes to compare")
    args = parser.parse_args()
    changed = {k: v for k, v in (("votes", args.votes), ("f_threshold", args.f_threshold))
               if v is not None}
    note = dict(changed)
    if args.votes is not None:
        note["note"] = (f"votes {args.votes}: a split needs {args.votes} of the last "
                        "`patience` windows above f_threshold, the latest among them "
                        "(default: all of them)")
    rows = [json.loads(line) for line in args.results.read_text().splitlines() if line]
    rerun: dict[str, list[str]] = {m: [] for m in METHODS}
    verdicts: dict[tuple[str, str], int | None] = {}
    for row in rows:
        method, cell = row["algorithm"], row["cell"]
        if method not in METHODS or row["seed"] != args.seed:
            continue
        run = args.runs / cell / method / f"seed{args.seed}"
        if not (run / "metrics.jsonl").exists():
            print(f"no run folder for {cell} {method} ({run}): to be re-run")
            rerun[method].append(cell)
            continue
        try:
            params, candidate = _params(run, changed)
        except ConfigError as err:  # e.g. votes above the run's patience
            print(f"replay_split_rule: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        verdicts[cell, method] = first_divergence(run / "metrics.jsonl", method, params,
                                                  candidate)
        if verdicts[cell, method] is not None:
            rerun[method].append(cell)
            if args.show:
                print(f"  {method} {cell}: diverges at round {verdicts[cell, method]}"
                      f"{' (no hidden groups)' if row['groups'] == 1 else ''}")
        elif args.out is not None:
            target = args.out / method / "results.jsonl"
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("a") as fh:
                fh.write(json.dumps(row | {"params": note, "replayed": True}) + "\n")
    for method in METHODS:
        replayed = [v for (_, m), v in verdicts.items() if m == method]
        print(f"{method}: {sum(v is not None for v in replayed)} of {len(replayed)} replayed "
              f"runs change; to run: --only {','.join(rerun[method])}")
    defaults = {(r["cell"], r["algorithm"]): r for r in rows if r["seed"] == args.seed}
    for trials in args.check:
        for line in trials.read_text().splitlines():
            trial = json.loads(line)
            key = (trial["cell"], trial["algorithm"])
            if (trial["seed"] != args.seed or key not in verdicts
                    or verdicts[key] is not None or trial.get("replayed")):
                continue
            same = all(trial[k] == defaults[key][k] for k in ("accuracy", "ari", "clusters"))
            print(f"check {key[0]} {key[1]}: {'identical' if same else 'DIFFERS'}")


if __name__ == "__main__":
    main()
