"""Published tables, regenerated instead of copied: each is declared here (configs, algorithms,
seeds), run by one command into a results file under version control, and rendered from that
file into its documentation page, never typed.

    python -m benchmarks.reproduce list                  # the tables, their pages and rows
    python -m benchmarks.reproduce run NAME [--quick]    # its rows (a run already there is kept)
    python -m benchmarks.reproduce render [--check]      # every page's tables from the rows

`--quick` runs the table's quick experiments for a few rounds on one seed into `runs/reproduce`
(not the committed rows): minutes, to prove the pipeline end to end. `render --check` (run by
`make docs` and `make test`) fails naming the page whose table differs from its rendering.
A table shows, per config and algorithm, final-round accuracy and the best accuracy over the
evaluated rounds (what peers often report; the difference is information), each as mean ± std
over seeds, the worst client and the clusters and ARI of each seed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "tables"
DOCS = ROOT / "docs"
QUICK_ROUNDS = 10


@dataclass(frozen=True)
class Experiment:
    config: str  # under configs/
    algorithms: tuple[str, ...]
    quick: bool = False  # part of the table's --quick variant (no dataset files needed)


@dataclass(frozen=True)
class Table:
    name: str
    page: str  # under docs/
    experiments: tuple[Experiment, ...]
    seeds: tuple[int, ...] = (0, 1, 2)

    def runs(self, quick: bool) -> list[tuple[Experiment, str, int]]:
        seeds = self.seeds[:1] if quick else self.seeds
        return [(e, a, s) for e in self.experiments if e.quick or not quick
                for a in e.algorithms for s in seeds]


TABLES = {t.name: t for t in [
    Table("four-groups-digits", "results/index.md", (
        Experiment("digits_label_permutation.yaml", ("cfl", "fedavg", "oracle"), quick=True),
        Experiment("digits_rotation.yaml", ("cfl", "fedavg", "oracle"), quick=True),
        Experiment("digits_iid.yaml", ("cfl", "fedavg"), quick=True),
    )),
]}


def results_file(name: str, results: Path) -> Path:
    return results / f"{name}.jsonl"


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_one(table: Table, experiment: Experiment, algorithm: str, seed: int, quick: bool,
            out: Path) -> dict[str, Any]:
    """One run's row: final and best-over-rounds accuracy, worst client, clusters, ARI."""
    from fedflock.api import run
    from fedflock.compare import config_for
    from fedflock.config import load_raw

    raw = config_for(load_raw(ROOT / "configs" / experiment.config), algorithm)
    raw["seed"] = seed
    if quick:
        raw["rounds"] = QUICK_ROUNDS
    stem = experiment.config.removesuffix(".yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run(raw, out / table.name / stem / algorithm / f"seed{seed}")
    curve = [value for _, value in result.curve()]
    summary = result.summary
    return {"config": stem, "algorithm": algorithm, "seed": seed, "rounds": raw["rounds"],
            "final": summary["accuracy"]["mean"], "best": max(curve, default=None),
            "worst": summary["accuracy"]["worst"], "clusters": summary["num_clusters"],
            "ari": summary.get("ari")}


def run_table(table: Table, quick: bool, results: Path, out: Path) -> Path:
    path = results_file(table.name, results)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["config"], r["algorithm"], r["seed"]) for r in read_rows(path)}
    for experiment, algorithm, seed in table.runs(quick):
        key = (experiment.config.removesuffix(".yaml"), algorithm, seed)
        if key in done:
            continue
        row = run_one(table, experiment, algorithm, seed, quick, out)
        with path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(f"{table.name}: {key} final {row['final']:.4f}", flush=True)
    return path


def _mean_std(values: list[float]) -> str:
    pct = [100 * v for v in values]
    if len(pct) == 1:
        return f"{pct[0]:.1f}"
    return f"{statistics.mean(pct):.1f} ± {statistics.stdev(pct):.1f}"


def _ari(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.2f}"


def render_table(table: Table, rows: list[dict[str, Any]]) -> str:
    """The Markdown table of a table's rows, in the declared order, and its command."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["seed"]):
        by_key.setdefault((row["config"], row["algorithm"]), []).append(row)
    lines = ["| config | algorithm | seeds | final accuracy % | best over rounds % | "
             "worst client % | clusters | ARI |", "|---|---|---|---|---|---|---|---|"]
    for experiment in table.experiments:
        stem = experiment.config.removesuffix(".yaml")
        for algorithm in experiment.algorithms:
            got = by_key.get((stem, algorithm))
            if not got:
                continue
            best = [r["best"] for r in got if r["best"] is not None]
            lines.append(
                f"| `{stem}` | {algorithm} | {', '.join(str(r['seed']) for r in got)} | "
                f"**{_mean_std([r['final'] for r in got])}** | "
                f"{_mean_std(best) if best else '–'} | "
                f"{statistics.mean(100 * r['worst'] for r in got):.1f} | "
                f"{', '.join(str(r['clusters']) for r in got)} | "
                f"{', '.join(_ari(r['ari']) for r in got)} |")
    rounds = sorted({r["rounds"] for r in rows})
    lines += ["", f"Rounds: {', '.join(map(str, rounds))}. Rows: "
              f"`benchmarks/results/tables/{table.name}.jsonl`, made by "
              f"`python -m benchmarks.reproduce run {table.name}`."]
    return "\n".join(lines) + "\n"


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- reproduce: {re.escape(name)} -->\n)(.*?)(<!-- /reproduce -->)",
                      re.S)


def render(results: Path, docs: Path, check: bool) -> list[str]:
    """Write (or, with `check`, compare) every table into its page; the pages that differ."""
    stale = []
    for table in TABLES.values():
        page = docs / table.page
        text = page.read_text()
        pattern = _block(table.name)
        if not pattern.search(text):
            raise SystemExit(f"{page}: no '<!-- reproduce: {table.name} -->' block")
        rendered = render_table(table, read_rows(results_file(table.name, results)))
        new = pattern.sub(lambda m, body=rendered: m.group(1) + body + m.group(3), text)
        if new != text:
            stale.append(f"{table.page}: table '{table.name}' differs from its rendering")
            if not check:
                page.write_text(new)
    return stale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    runs = sub.add_parser("run")
    runs.add_argument("name", choices=sorted(TABLES))
    runs.add_argument("--quick", action="store_true")
    runs.add_argument("--results", type=Path, default=None,
                      help="where the rows go (default: the committed ones; --quick: "
                      "runs/reproduce/results)")
    runs.add_argument("--out", type=Path, default=Path("runs/reproduce"))
    renders = sub.add_parser("render")
    renders.add_argument("--check", action="store_true")
    renders.add_argument("--results", type=Path, default=RESULTS)
    renders.add_argument("--docs", type=Path, default=DOCS)
    args = parser.parse_args()
    if args.command == "list":
        for table in TABLES.values():
            rows = len(read_rows(results_file(table.name, RESULTS)))
            print(f"{table.name}: docs/{table.page}, {len(table.runs(False))} runs "
                  f"({len(table.runs(True))} quick), {rows} rows committed")
    elif args.command == "run":
        results = args.results or (args.out / "results" if args.quick else RESULTS)
        print(run_table(TABLES[args.name], args.quick, results, args.out))
    else:
        stale = render(args.results, args.docs, args.check)
        for line in stale:
            print(f"{line}{'; run python -m benchmarks.reproduce render' if args.check else ''}",
                  file=sys.stderr if args.check else sys.stdout)
        if args.check and stale:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
