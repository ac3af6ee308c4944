"""Would a merge test at a common model tell clusters of one group from clusters of two?

The evidence behind the merge test proposed for issue 13 (not implemented yet). Two clusters'
own updates cannot answer it: near its own model each cluster's updates are noise around zero,
whatever the groups. At one model they can: let the members of cluster A train cluster B's
model beside B's members (a *probe*, one extra model down and update up), and score the cut
{A's probes | B's updates} with the split test's pseudo-F — about 1 when A and B hold one
group, large when they point apart, the same scale-free statistic and threshold as a split.
The proposed rule merges A and B when the cut scores at most `f_threshold` at both models.

For each finished run (its last checkpoint's cluster models) and each pair of clusters of at
least 2 members, this trains up to `--members` sampled members of each at B's model and at
A's, and prints the cut's pseudo-F at both, whether the clusters' majority groups agree, and
per run the pairs the rule would merge.

    python benchmarks/merge_probe.py --runs runs/grid2-all --seed 2 --method incremental \\
        --cells mnist5k-iid-g1-n123-s97-p57-r50,digits-label_permutation-g4-n77-s55-p7-r150
    python benchmarks/merge_probe.py --runs runs/grid2-all --seed 2 --out pairs.jsonl  # all
"""

from __future__ import annotations

import argparse
import itertools
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedflock.algorithms import validate_params
from fedflock.client.runtime import ClientRuntime
from fedflock.client.tasks import Train
from fedflock.clustering.split_stats import pseudo_f
from fedflock.config import load_raw
from fedflock.data.scenarios import build_federated_data
from fedflock.rundir import RunDirectory
from fedflock.similarity import cosine_from_gram, gram_matrix
from fedflock.validation import validate


def cut_score(runtime: ClientRuntime, model: torch.Tensor, probes: list[int],
              own: list[int]) -> float:
    """Pseudo-F of the cut {probes | own} of the updates all of them compute at `model`."""
    width = runtime.spec.num_trainable
    updates = torch.stack([Train(c, 0, model).run(runtime).update[:width]
                           for c in probes + own])
    similarity = cosine_from_gram(gram_matrix(updates)).numpy().astype(np.float64)
    return pseudo_f(similarity, (list(range(len(probes))),
                                 list(range(len(probes), len(probes) + len(own)))))


def probe_run(run_dir: Path, members: int, rng: np.random.Generator,
              threshold: float | None = None) -> list[dict[str, Any]]:
    run = RunDirectory(run_dir)
    config = validate(load_raw(run.config_path))
    if threshold is None:
        threshold = validate_params(config.algorithm).f_threshold
    state = run.read_checkpoint(config.algorithm.name)["algorithm"]
    data = build_federated_data(config.data, config.seed)
    runtime = ClientRuntime(data, config.model, config.training, config.seed, config.privacy)
    clusters = [c for c in state["clusters"] if len(c["members"]) >= 2]

    def sample(cluster: dict[str, Any]) -> list[int]:
        chosen = rng.choice(cluster["members"], size=min(members, len(cluster["members"])),
                            replace=False)
        return sorted(int(c) for c in chosen)

    rows = []
    for a, b in itertools.combinations(clusters, 2):
        groups = [int(np.bincount(data.groups[c["members"]]).argmax()) for c in (a, b)]
        sa, sb = sample(a), sample(b)
        at_b, at_a = (cut_score(runtime, b["params"], sa, sb),
                      cut_score(runtime, a["params"], sb, sa))
        rows.append({"a": a["id"], "b": b["id"], "sizes": [len(a["members"]),
                     len(b["members"])], "same_group": groups[0] == groups[1],
                     "f_at_b": round(at_b, 3), "f_at_a": round(at_a, 3),
                     "merge": max(at_a, at_b) <= threshold})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, required=True, help="a grid.py --out folder")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--method", default="incremental")
    parser.add_argument("--cells", default=None, help="comma-separated cell names (default: "
                        "every cell of --runs with a run of --method and --seed)")
    parser.add_argument("--out", type=Path, default=None, help="append every pair's row "
                        "(JSON lines) to this file")
    parser.add_argument("--members", type=int, default=40, help="members sampled per cluster")
    parser.add_argument("--threshold", type=float, default=None,
                        help="the merge bar (default: the run's f_threshold)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| cell | pairs of one group: merged / all, larger F min–max | pairs of two groups: "
          "merged / all, larger F min–max |")
    print("|---|---|---|")
    cells = (args.cells.split(",") if args.cells else sorted(
        d.name for d in args.runs.iterdir()
        if (d / args.method / f"seed{args.seed}" / "checkpoints").is_dir()))
    for cell in cells:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows = probe_run(args.runs / cell / args.method / f"seed{args.seed}", args.members,
                             rng, args.threshold)
        if args.out is not None:
            with args.out.open("a") as fh:
                for row in rows:
                    fh.write(json.dumps({"cell": cell, "method": args.method,
                                         "seed": args.seed, **row}) + "\n")
        cols = []
        for same in (True, False):
            picked = [r for r in rows if r["same_group"] == same]
            larger = [max(r["f_at_a"], r["f_at_b"]) for r in picked]
            cols.append(f"{sum(r['merge'] for r in picked)} / {len(picked)}, "
                        f"{min(larger):.2f}–{max(larger):.2f}" if picked else "–")
        print(f"| {cell} | {cols[0]} | {cols[1]} |", flush=True)


if __name__ == "__main__":
    main()
