"""The kinds of published table: what runs make a table's rows and how its Markdown is rendered
from them. `benchmarks/reproduce.py` declares the tables and writes them into their pages.

- `ConfigTable`: configs (with overrides) x algorithms x seeds, one row per run, one line per
  config and algorithm, the columns chosen from `COLUMNS`.
- `GridTable`: the scenario grid (`benchmarks/grid.py`), its acceptance counts per seed and
  method, from the grid's rows and the feature_skew cells' {invert, rest} rows
  (`benchmarks/congruence.py`).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import resource
import statistics
import subprocess
import sys
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUICK_ROUNDS = 10
Row = dict[str, Any]


def read_rows(path: Path) -> list[Row]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_row(path: Path, row: Row) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def not_run(name: str) -> str:
    return f"(Not run yet: `python -m benchmarks.reproduce run {name}`.)\n"


def _pct(values: list[float]) -> str:
    pct = [100 * v for v in values]
    if len(pct) == 1:
        return f"{pct[0]:.1f}"
    return f"{statistics.mean(pct):.1f} ± {statistics.stdev(pct):.1f}"


def _mean_sd(values: list[float], digits: int = 1) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _ari(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.2f}"


def _values(rows: list[Row], field: str) -> list[Any]:
    return [r[field] for r in rows if r.get(field) is not None]


def _newcomers(joined: list[Row]) -> str:
    if not joined:
        return "–"
    return (f"{statistics.mean(j['placed'] for j in joined):.0%} / "
            f"{', '.join(_ari(j['ari']) for j in joined)} / "
            f"{_pct([j['final'] for j in joined])}")


@dataclass(frozen=True)
class Column:
    """One column of a rendered table: its header and its cell from one line's seeds."""
    header: str
    cell: Callable[[list[Row]], str]


def _pct_column(header: str, field: str, bold: bool = False) -> Column:
    def cell(rows: list[Row]) -> str:
        got = _values(rows, field)
        text = _pct(got) if got else "–"
        return f"**{text}**" if bold and got else text
    return Column(header, cell)


def _per_seed(header: str, field: str, show: Callable[[Any], str]) -> Column:
    return Column(header, lambda rows: ", ".join(show(r.get(field)) for r in rows))


def _mean_of(header: str, field: str, scale: float, digits: int) -> Column:
    def cell(rows: list[Row]) -> str:
        got = _values(rows, field)
        return f"{statistics.mean(got) * scale:,.{digits}f}" if got else "–"
    return Column(header, cell)


COLUMNS = {
    "final": _pct_column("final accuracy %", "final", bold=True),
    "best": _pct_column("best over rounds %", "best"),
    "worst": _mean_of("worst client %", "worst", 100, 1),
    "clusters": _per_seed("clusters", "clusters", str),
    "ari": _per_seed("ARI", "ari", _ari),
    "benign": _pct_column("benign accuracy %", "benign", bold=True),
    "benign_best": _pct_column("benign, best over rounds %", "benign_best"),
    "asr": _pct_column("attack success %", "asr"),
    "traffic": Column("uplink / downlink (M floats)", lambda rows: (
        f"{statistics.mean(_values(rows, 'up')):.1f} / "
        f"{statistics.mean(_values(rows, 'down')):.1f}")),
    "seconds": _mean_of("wall s", "seconds", 1, 0),
    "clustered": Column("clustered at round (clients seen)", lambda rows: ", ".join(
        f"{r['clustered_round']} ({r['clustered_seen']:,})" if r.get("clustered_round")
        else "–" for r in rows)),
    "peak_rss": _mean_of("peak RSS GiB", "peak_rss", 1 / 2**30, 2),
    "alternative": Column("scored another way %", lambda rows: "; ".join(
        f"{name} {_pct([r['alternatives'][name] for r in rows])}"
        for name in sorted({n for r in rows for n in r.get("alternatives", {})})) or "–"),
    "newcomers": Column("newcomers: in their group's cluster % / ARI / accuracy %",
                        lambda rows: _newcomers([r["newcomers"] for r in rows
                                                 if r.get("newcomers")])),
    "perplexity": Column("final perplexity",
                         lambda rows: f"**{_mean_sd(_values(rows, 'final'))}**"),
    "perplexity_best": Column("lowest over rounds",
                              lambda rows: _mean_sd(_values(rows, "best"))),
    "perplexity_worst": _mean_of("worst client", "worst", 1, 1),
    "next_token_accuracy": Column("next-token accuracy %", lambda rows: _pct(
        [r["secondary"]["accuracy"] for r in rows if "secondary" in r])),
    "nmi": _per_seed("NMI", "nmi", _ari),
    "round_seconds": _mean_of("s/round", "round_seconds", 1, 2),
    "outside_training": _mean_of("outside local training %", "outside_training", 100, 1),
    "sigma": _mean_of("σ", "sigma", 1, 2),
    "epsilon": _mean_of("whole-run ε", "epsilon", 1, 1),
}
STANDARD = ("final", "best", "worst", "clusters", "ari")


@dataclass(frozen=True)
class Experiment:
    config: str  # under configs/
    algorithms: tuple[str, ...]
    quick: bool = False  # part of the table's --quick variant (no dataset files needed)
    overrides: tuple[str, ...] = ()  # `--set` style, e.g. "attack.fraction=0.4"
    label: str = ""  # the table's name for it (default: the config's stem)
    newcomers: int = 0  # after the run, that many new clients join it (`fedflock assign`)

    @property
    def key(self) -> str:
        return self.label or self.config.removesuffix(".yaml")


def _benign_curve(metrics: list[Row], metric: str, malicious: set[int]) -> list[float]:
    """Per evaluated round, the benign clients' mean of the primary metric."""
    curve = []
    for record in metrics:
        per_client = record.get(metric)
        if isinstance(per_client, list):
            benign = [v for c, v in enumerate(per_client) if c not in malicious and v is not None]
            if benign:
                curve.append(statistics.mean(benign))
    return curve


def run_one(experiment: Experiment, algorithm: str, seed: int, rounds: int | None,
            threads: int | None, where: Path) -> Row:
    """One run's row: final and best-over-rounds primary metric, worst client, clusters, ARI,
    traffic, wall seconds and the process's peak RSS; under attack the benign clients' final
    and best figure and the attack success rate."""
    import torch
    from sklearn.metrics import normalized_mutual_info_score

    from fedflock.client.objectives import get_objective
    from fedflock.compare import config_for
    from fedflock.config import apply_overrides, load_raw
    from fedflock.summary import partition_labels

    if threads:
        torch.set_num_threads(threads)
    raw = apply_overrides(load_raw(ROOT / "configs" / experiment.config),
                          list(experiment.overrides))
    raw = config_for(raw, algorithm)
    raw["seed"] = seed
    raw["rounds"] = rounds or raw["rounds"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result, measured_here = _finish(raw, where)
    summary = result.summary
    metric = summary.get("primary_metric", "accuracy")
    objective = get_objective(summary.get("objective", "classification"))
    curve = [value for _, value in result.curve()]
    best = max if objective.higher_is_better else min  # perplexity: the lowest
    row = {"config": experiment.key, "algorithm": algorithm, "seed": seed,
           "rounds": raw["rounds"], "final": summary[metric]["mean"],
           "best": best(curve, default=None), "worst": summary[metric]["worst"],
           "clusters": summary["num_clusters"], "ari": summary.get("ari"),
           "up": summary["communication"]["up_floats"] / 1e6,
           "down": summary["communication"]["down_floats"] / 1e6,
           "seconds": summary["wall_seconds"],
           "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
           if measured_here else None}
    for name in objective.secondary:  # e.g. next-token accuracy beside perplexity
        row.setdefault("secondary", {})[name] = summary[name]["mean"]
    if summary.get("true_groups") is not None:
        row["nmi"] = round(float(normalized_mutual_info_score(
            summary["true_groups"], partition_labels(summary["clusters"],
                                                     summary["num_clients"]))), 6)
    timing = summary.get("timing") or {}
    if timing.get("round_seconds"):  # rounds run by this process
        row |= {"round_seconds": timing["round_seconds"] / raw["rounds"],
                "outside_training": timing["outside_training_share"]}
    every = max(1, raw["rounds"] // 12)
    row["course"] = [{k: m[k] for k in ("round", f"{metric}_mean", "ari", "ari_placed",
                                         "unplaced", "num_clusters") if m.get(k) is not None}
                     for m in result.metrics if m["round"] % every == 0]
    if summary.get("splits") and summary.get("true_groups"):
        first, groups = summary["splits"][0], summary["true_groups"]
        held = [{groups[c] for c in part} for part in first["members"]]
        # correct: each part holds one group and no group is in two parts
        row["first_split"] = {"round": first["round"], "correct": all(
            len(h) == 1 for h in held) and len(set().union(*held)) == len(held)}
    for name, other in (summary.get("alternatives") or {}).items():  # e.g. a mixture's hard
        row.setdefault("alternatives", {})[name] = other[metric]["mean"]
    if experiment.newcomers:  # new clients of the same scenario join the trained run
        from fedflock.assign import assign_new_clients

        joined = assign_new_clients(where, experiment.newcomers)
        row["newcomers"] = {"placed": joined["routed_correctly"], "ari": joined["ari"],
                            "final": joined[f"{metric}_mean"]}
    if summary.get("dp"):  # the noise the privacy budget cost, and the budget spent
        row |= {"sigma": summary["dp"]["noise_multiplier"], "epsilon": summary["dp"]["epsilon"]}
    clustering = next((r for r in result.metrics if "clustering_seconds" in r), None)
    if clustering:  # incremental's clustering round: when, with how many clients seen
        row |= {"clustered_round": clustering["round"], "clustered_seen": clustering["stored"],
                "clustering_seconds": clustering["clustering_seconds"]}
    attack = summary.get("attack")
    if attack and attack.get(f"benign_{metric}") is not None:
        benign = _benign_curve(result.metrics, metric, set(attack["malicious"]))
        row |= {"benign": attack[f"benign_{metric}"],
                "benign_best": round(max(benign), 6) if benign else None,
                "asr": attack.get("attack_success_rate")}
    else:  # no attack: every client is benign
        row |= {"benign": row["final"], "benign_best": row["best"]}
    return row


def _finish(raw: dict[str, Any], where: Path) -> tuple[Any, bool]:
    """The run of `raw` in `where`, and whether this process ran all of it: a table stopped
    mid-way leaves run directories behind, so a finished one is read back (its row was not
    appended yet) and one with a checkpoint resumes; the run directory refuses either if its
    config is not this one."""
    from fedflock.api import Result, as_config, run
    from fedflock.experiment import check_run_directory
    from fedflock.report.load import read_metrics

    if not (where / "config.yaml").is_file():
        return run(raw, where), True
    continues = check_run_directory(as_config(raw), where, resume=True)  # same config or raise
    if (where / "summary.json").is_file():
        summary = json.loads((where / "summary.json").read_text())
        return Result(summary, read_metrics(where / "metrics.jsonl"), where), False
    return run(raw, where, resume=continues), not continues


def _run_isolated(*args: Any) -> Row:
    """`run_one` in a fresh process: its peak RSS is the run's own, not the largest so far."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        return pool.submit(run_one, *args).result()


@dataclass(frozen=True)
class ConfigTable:
    name: str
    page: str  # under docs/
    experiments: tuple[Experiment, ...]
    seeds: tuple[int, ...] = (0, 1, 2)
    columns: tuple[str, ...] = STANDARD
    isolated: bool = False  # each run in a fresh process, so its peak RSS is its own
    threads: int | None = None  # torch threads per run (rounding: a row may depend on it)
    appendix: Callable[[list[Row]], str] | None = None  # a second view of the same rows
    # (line, algorithm) whose final figure every line's is divided by, seed by seed: a column
    # each (perplexity as a share of FedAvg's, of the oracle's)
    against: tuple[tuple[str, str], ...] = ()

    def runs(self, quick: bool) -> list[tuple[Experiment, str, int]]:
        seeds = self.seeds[:1] if quick else self.seeds
        return [(e, a, s) for e in self.experiments if e.quick or not quick
                for a in e.algorithms for s in seeds]

    def rows_files(self, results: Path) -> list[Path]:
        return [results / f"{self.name}.jsonl"]

    def run(self, quick: bool, results: Path, out: Path, jobs: int = 1) -> Path:
        """Every run not already in the rows file, appended to it as it finishes; with `jobs`
        > 1 that many at a time, each in a fresh process (rows land in finishing order;
        rendering orders them)."""
        path = self.rows_files(results)[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        done = {(r["config"], r["algorithm"], r["seed"]) for r in read_rows(path)}
        todo = [(e, a, s, QUICK_ROUNDS if quick else None, self.threads,
                 out / self.name / e.key / a / f"seed{s}")
                for e, a, s in self.runs(quick) if (e.key, a, s) not in done]

        def record(row: Row) -> None:
            append_row(path, row)
            print(f"{self.name}: {(row['config'], row['algorithm'], row['seed'])} "
                  f"final {row['final']:.4f}", flush=True)

        if jobs > 1:
            spawn = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(jobs, mp_context=spawn, max_tasks_per_child=1) as pool:
                for future in as_completed([pool.submit(run_one, *args) for args in todo]):
                    record(future.result())
        else:
            runner = _run_isolated if self.isolated else run_one
            for args in todo:
                record(runner(*args))
        return path

    def render(self, results: Path) -> str:
        """The Markdown table of the rows, in the declared order, and its command."""
        rows = read_rows(self.rows_files(results)[0])
        if not rows:
            return not_run(self.name)
        by_key: dict[tuple[str, str], list[Row]] = {}
        for row in sorted(rows, key=lambda r: r["seed"]):
            by_key.setdefault((row["config"], row["algorithm"]), []).append(row)
        columns = [COLUMNS[c] for c in self.columns] + [
            self._ratio(by_key.get(reference, []), algorithm) for reference in self.against
            for _, algorithm in [reference]]
        lines = ["| config | algorithm | seeds | " + " | ".join(c.header for c in columns)
                 + " |", "|---|---|---|" + "---|" * len(columns)]
        for experiment in self.experiments:
            for algorithm in experiment.algorithms:
                got = by_key.get((experiment.key, algorithm))
                if got:
                    lines.append(f"| `{experiment.key}` | {algorithm} | "
                                 f"{', '.join(str(r['seed']) for r in got)} | "
                                 + " | ".join(c.cell(got) for c in columns) + " |")
        if self.appendix is not None and rows:
            lines += ["", self.appendix(rows).rstrip("\n")]
        rounds = sorted({r["rounds"] for r in rows})
        lines += ["", f"Rounds: {', '.join(map(str, rounds))}. Rows: "
                  f"`benchmarks/results/tables/{self.name}.jsonl`, made by "
                  f"`python -m benchmarks.reproduce run {self.name}`."]
        return "\n".join(lines) + "\n"


    @staticmethod
    def _ratio(reference: list[Row], name: str) -> Column:
        """A line's final figure over the reference line's, per seed, then their mean."""
        of_seed = {r["seed"]: r["final"] for r in reference}

        def cell(rows: list[Row]) -> str:
            ratios = [r["final"] / of_seed[r["seed"]] for r in rows if of_seed.get(r["seed"])]
            return _mean_sd(ratios, 2) if ratios else "–"
        return Column(f"÷ {name}", cell)


@dataclass(frozen=True)
class SweepTable(ConfigTable):
    """One setting varied at a time: one line per setting (an experiment's first override),
    one column per scenario (its label after the setting), each cell `cell` of the seeds' rows
    (by default mean ARI / mean clusters). `defaults` are marked with *."""
    defaults: tuple[str, ...] = ()
    cell: Callable[[list[Row]], str] = lambda rows: (
        f"{statistics.mean(_values(rows, 'ari')):.2f} / "
        f"{statistics.mean(_values(rows, 'clusters')):.1f}")
    legend: str = "ARI / clusters found, mean over seeds"

    def render(self, results: Path) -> str:
        rows = read_rows(self.rows_files(results)[0])
        if not rows:
            return not_run(self.name)
        by_key: dict[str, list[Row]] = {}
        for row in rows:
            by_key.setdefault(row["config"], []).append(row)
        settings = list(dict.fromkeys(e.overrides[0] for e in self.experiments))
        scenarios = list(dict.fromkeys(e.label.split(" · ")[1] for e in self.experiments))
        lines = ["| setting | " + " | ".join(scenarios) + " |",
                 "|---|" + "---|" * len(scenarios)]
        for setting in settings:
            cells = []
            for scenario in scenarios:
                got = by_key.get(f"{setting} · {scenario}", [])
                cells.append(self.cell(sorted(got, key=lambda r: r["seed"])) if got else "–")
            mark = " *" if setting in self.defaults else ""
            lines.append(f"| `{setting}`{mark} | " + " | ".join(cells) + " |")
        rounds = sorted({r["rounds"] for r in rows})
        lines += ["", f"{self.legend} "
                  f"{', '.join(map(str, self.seeds))}; rounds: {', '.join(map(str, rounds))}. "
                  f"Rows: `benchmarks/results/tables/{self.name}.jsonl`, made by "
                  f"`python -m benchmarks.reproduce run {self.name}`."]
        return "\n".join(lines) + "\n"


def first_split_cell(rows: list[Row]) -> str:
    """Over seeds: on how many the first split was into the true groups, and its rounds."""
    firsts = [r.get("first_split") for r in rows]
    correct = sum(bool(f and f["correct"]) for f in firsts)
    return (f"{correct} of {len(rows)} (rounds "
            f"{', '.join(str(f['round']) if f else '–' for f in firsts)})")


def course_table(algorithm: str, fields: dict[str, str]) -> Callable[[list[Row]], str]:
    """An appendix: `algorithm`'s figures over the rounds of its runs' courses (mean over
    seeds), one line per field (header: field of the course), one column per recorded round."""
    def render(rows: list[Row]) -> str:
        runs = [r for r in rows if r["algorithm"] == algorithm and r.get("course")]
        rounds = sorted({point["round"] for r in runs for point in r["course"]})
        lines = ["| round | " + " | ".join(map(str, rounds)) + " |",
                 "|---|" + "---|" * len(rounds)]
        for header, field in fields.items():
            cells = []
            for rnd in rounds:
                got = [p[field] for r in runs for p in r["course"]
                       if p["round"] == rnd and p.get(field) is not None]
                cells.append("–" if not got else f"{statistics.mean(got):.2f}"
                             if isinstance(got[0], float) else f"{statistics.mean(got):.0f}")
            lines.append(f"| {header} ({algorithm}) | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"
    return render


GOOD_ARI = 0.95  # as benchmarks/grid.py
GAIN = 0.05
NO_GROUPS = ("iid", "natural")


def _cell_line(runs: dict[tuple[str, str, int], Row], cell: str, scenario: str,
               seeds: tuple[int, ...], methods: tuple[str, ...]) -> str:
    """One grid cell: FedAvg's and the oracle's accuracy, each method's with its ARI (none for
    a cell without groups) and clusters per seed."""
    def of(algorithm: str) -> list[Row]:
        return [runs[cell, algorithm, s] for s in seeds if (cell, algorithm, s) in runs]

    def accuracy(algorithm: str) -> str:
        got = [r["accuracy"] for r in of(algorithm)]
        return f"{100 * statistics.mean(got):.1f}" if got else "–"

    entries = []
    for method in methods:
        got = of(method)
        ari = "" if scenario in NO_GROUPS else f"ARI {' / '.join(_ari(r['ari']) for r in got)}, "
        entries.append(f"{accuracy(method)} ({ari}k {'/'.join(str(r['clusters']) for r in got)})")
    return (f"| {cell} | {accuracy('fedavg')} | {accuracy('oracle')} | " + " | ".join(entries)
            + " |")


@dataclass(frozen=True)
class GridTable:
    """The scenario grid's acceptance counts: per seed and method, the cells where the oracle
    beats FedAvg by 5 points or more ("paying"), those a method finds at ARI >= 0.95 against
    the scenario's groups and against {invert, rest} for the feature_skew cells of 3 or more
    groups, and the no-group cells (IID, FEMNIST writers) it split."""
    name: str
    page: str
    seeds: tuple[int, ...] = (0, 1, 2, 3)
    methods: tuple[str, ...] = ("incremental", "cfl")
    cells: int = 60

    def runs(self, quick: bool) -> list[int]:
        return [] if quick else list(self.seeds)

    def rows_files(self, results: Path) -> list[Path]:
        return [results / f"{self.name}.jsonl", results / f"{self.name}-congruence.jsonl"]

    def run(self, quick: bool, results: Path, out: Path, jobs: int = 1) -> Path:
        """Each seed's grid (`grid.py`, resumable) and its feature_skew {invert, rest} rows
        (`congruence.py`), then their rows appended to the table's files."""
        if quick:
            raise SystemExit(f"{self.name}: no --quick variant (a seed is hours of CPU)")
        if jobs > 1:
            raise SystemExit(f"{self.name}: no --jobs (grid.py runs its cells one at a time)")
        rows_path, coarse_path = self.rows_files(results)
        have = {(r["cell"], r["algorithm"], r["seed"]) for r in read_rows(rows_path)}
        coarse_have = {(r["cell"], r["seed"]) for r in read_rows(coarse_path)}
        for seed in self.seeds:
            folder = out / self.name / f"seed{seed}"
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grid.py"), "--cells",
                            str(self.cells), "--seeds", str(seed), "--methods",
                            ",".join(self.methods), "--out", str(folder)], check=True)
            for row in read_rows(folder / "results.jsonl"):
                if (row["cell"], row["algorithm"], row["seed"]) not in have:
                    append_row(rows_path, row)
            fresh = folder / "congruence.jsonl"
            fresh.unlink(missing_ok=True)
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "congruence.py"),
                            "--seed", str(seed), "--runs", str(folder), "--results",
                            str(folder / "results.jsonl"), "--work", str(folder / "coarse"),
                            "--out", str(fresh)], check=True)
            for row in read_rows(fresh):
                if (row["cell"], row["seed"]) not in coarse_have:
                    append_row(coarse_path, row)
        return rows_path

    def render(self, results: Path) -> str:
        rows_path, coarse_path = self.rows_files(results)
        runs = {(r["cell"], r["algorithm"], r["seed"]): r for r in read_rows(rows_path)}
        if not runs:
            return not_run(self.name)
        coarse = {(r["cell"], r["seed"]): r for r in read_rows(coarse_path)}
        cells = {r["cell"]: r for r in runs.values()}
        lines = ["| seed | method | paying cells | ARI ≥ 0.95 | feature_skew against "
                 "{invert, rest} | IID cells split | FEMNIST writer cells split |",
                 "|---|---|---|---|---|---|---|"]
        for seed in self.seeds:
            paying = [c for c in cells if cells[c]["scenario"] not in NO_GROUPS
                      and (c, "oracle", seed) in runs and (c, "fedavg", seed) in runs
                      and runs[c, "oracle", seed]["accuracy"]
                      - runs[c, "fedavg", seed]["accuracy"] >= GAIN]
            for method in self.methods:
                mine = [runs[c, method, seed] for c in paying if (c, method, seed) in runs]
                if not mine:
                    continue
                found = sum(r["ari"] >= GOOD_ARI for r in mine)
                needed = sum((coarse[r["cell"], seed][method]["ari_coarse"]
                              if (r["cell"], seed) in coarse else r["ari"]) >= GOOD_ARI
                             for r in mine)
                split = {kind: [r for (c, m, s), r in runs.items() if s == seed and m == method
                                and cells[c]["scenario"] == kind] for kind in NO_GROUPS}
                lines.append(
                    f"| {seed} | {method} | {len(mine)} | {found} ({found / len(mine):.1%}) | "
                    f"{needed} ({needed / len(mine):.1%}) | "
                    + " | ".join(f"{sum(r['clusters'] > 1 for r in split[k])} of "
                                 f"{len(split[k])}" for k in NO_GROUPS) + " |")
        lines += ["", "<details><summary>Per cell: final accuracy % (mean over seeds "
                  f"{', '.join(map(str, self.seeds))}), and per seed the ARI and the clusters "
                  "found</summary>", "", "| cell | fedavg | oracle | "
                  + " | ".join(self.methods) + " |", "|---|---|---|" + "---|" * len(self.methods)]
        lines += [_cell_line(runs, cell, row["scenario"], self.seeds, self.methods)
                  for cell, row in cells.items()]
        lines += ["", "</details>"]
        lines += ["", f"Rows: `benchmarks/results/tables/{self.name}.jsonl` and "
                  f"`{self.name}-congruence.jsonl`, made by "
                  f"`python -m benchmarks.reproduce run {self.name}`."]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class TimingTable:
    """Rows measured by a benchmark module (`python -m benchmarks.MODULE args... --rows FILE`
    writes one JSON line per measurement, with `machine_facts()`), rendered in its order:
    one column per (header, format) pair, the format filled from a row (`"{seconds:.1f}"`).
    Timings depend on the machine and its load: the footer says which the rows record."""
    name: str
    page: str
    module: str  # benchmarks.<module>
    fields: tuple[tuple[str, str], ...]
    args: tuple[str, ...] = ()

    def runs(self, quick: bool) -> list[str]:
        return [] if quick else [self.module]

    def rows_files(self, results: Path) -> list[Path]:
        return [results / f"{self.name}.jsonl"]

    def run(self, quick: bool, results: Path, out: Path, jobs: int = 1) -> Path:
        """The script, afresh: its rows replace the table's (a timing is not resumed)."""
        if quick or jobs > 1:
            raise SystemExit(f"{self.name}: timings run whole and alone (no --quick, no --jobs)")
        path = self.rows_files(results)[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = out / self.name / "rows.jsonl"
        fresh.parent.mkdir(parents=True, exist_ok=True)
        fresh.unlink(missing_ok=True)
        subprocess.run([sys.executable, "-m", f"benchmarks.{self.module}", *self.args,
                        "--rows", str(fresh.resolve())], check=True, cwd=ROOT)
        path.write_text(fresh.read_text())
        return path

    def render(self, results: Path) -> str:
        rows = read_rows(self.rows_files(results)[0])
        if not rows:
            return not_run(self.name)
        lines = ["| " + " | ".join(h for h, _ in self.fields) + " |",
                 "|" + "---|" * len(self.fields)]
        lines += ["| " + " | ".join(f.format_map(r) for _, f in self.fields) + " |"
                  for r in rows]
        machine = rows[0].get("machine", {})
        facts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in machine.items())
        lines += ["", f"Measured on {facts or 'an unrecorded machine'}. Rows: "
                  f"`benchmarks/results/tables/{self.name}.jsonl`, made by "
                  f"`python -m benchmarks.reproduce run {self.name}` (it runs "
                  f"`python -m benchmarks.{' '.join((self.module, *self.args))}`)."]
        return "\n".join(lines) + "\n"


def machine_facts() -> dict[str, Any]:
    """What a timing depends on, recorded beside it: cores, torch threads, the load at start."""
    import os

    import torch

    return {"cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average": round(os.getloadavg()[0], 1)}


def _line_rows(results: Path, table: str, config: str, algorithm: str) -> list[Row]:
    return sorted((r for r in read_rows(results / f"{table}.jsonl")
                   if r["config"] == config and r["algorithm"] == algorithm),
                  key=lambda r: r["seed"])


def versus(table: str, mine: tuple[str, str], theirs: tuple[str, str], field: str = "final",
           names: tuple[str, str] | None = None, what: str = "") -> Callable[[Path], str]:
    """A headline figure: one (config, algorithm) line of a table's rows against another."""
    def figure(results: Path) -> str:
        a, b = (_line_rows(results, table, *line) for line in (mine, theirs))
        if not a or not b:
            return "(not run yet)"
        first, second = names or (mine[1], theirs[1])
        return (f"{what}{first} **{_pct(_values(a, field))}** against {second} "
                f"{_pct(_values(b, field))}")
    return figure


def at_scale(table: str, config: str, algorithm: str) -> Callable[[Path], str]:
    """A headline figure: one run's partition, accuracy and peak memory."""
    def figure(results: Path) -> str:
        rows = _line_rows(results, table, config, algorithm)
        if not rows:
            return "(not run yet)"
        r = rows[0]
        return (f"ARI **{_ari(r['ari'])}**, {100 * r['final']:.1f}% accuracy, peak RSS "
                f"{r['peak_rss'] / 2**30:.2f} GiB, {r['seconds']:,.0f} s")
    return figure


def grid_found(table: str, method: str, seeds: tuple[int, ...]) -> Callable[[Path], str]:
    """A headline figure: the paying grid cells `method` finds, per held-out seed."""
    def figure(results: Path) -> str:
        runs = {(r["cell"], r["algorithm"], r["seed"]): r
                for r in read_rows(results / f"{table}.jsonl")}
        parts = []
        for seed in seeds:
            paying = [c for (c, a, s), r in runs.items() if a == "oracle" and s == seed
                      and r["scenario"] not in NO_GROUPS and (c, "fedavg", s) in runs
                      and r["accuracy"] - runs[c, "fedavg", s]["accuracy"] >= GAIN]
            found = sum(runs[c, method, seed]["ari"] >= GOOD_ARI for c in paying
                        if (c, method, seed) in runs)
            parts.append(f"{found} of {len(paying)}")
        return (f"{method} at ARI ≥ 0.95 on {', '.join(parts)} paying cells (held-out seeds "
                f"{', '.join(map(str, seeds))})")
    return figure


@dataclass(frozen=True)
class Headline:
    experiment: str  # what was run, in words
    link: str  # the page with its table, relative to the page the headline is rendered in
    title: str
    figure: Callable[[Path], str]  # from the committed rows


class View:
    """A table or figure made from other tables' rows: it has none of its own to run."""
    name: str

    def runs(self, quick: bool) -> list[Any]:
        return []

    def rows_files(self, results: Path) -> list[Path]:
        return []

    def run(self, quick: bool, results: Path, out: Path, jobs: int = 1) -> Path:
        raise SystemExit(f"{self.name}: nothing to run (it is drawn from other tables' rows)")


@dataclass(frozen=True)
class HeadlineTable(View):
    """A summary of other tables: one line per experiment, its figure read from their rows."""
    name: str
    page: str
    lines: tuple[Headline, ...]

    def render(self, results: Path) -> str:
        lines = ["| experiment | headline (final round, mean ± std over seeds) | page |",
                 "|---|---|---|"]
        lines += [f"| {h.experiment} | {h.figure(results)} | [{h.title}]({h.link}) |"
                  for h in self.lines]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Reported:
    """One column pair of `BesidePaper`: the paper's figures for a setting (quoted, by
    method) and the rows of ours (a table, and the label its experiments share)."""
    header: str  # the setting, as the paper names it
    ours: str  # ours, when it differs (dataset, shift parameter)
    table: str
    label: str
    paper: dict[str, float]  # method -> the paper's accuracy %


@dataclass(frozen=True)
class BesidePaper(View):
    """A paper's reported accuracies, quoted, beside our final-round means from other tables'
    rows; a method the paper or we did not run is a dash."""
    name: str
    page: str
    methods: tuple[tuple[str, str, str], ...]  # (name, algorithm, suffix of its label)
    columns: tuple[Reported, ...]

    def render(self, results: Path) -> str:
        head = " | ".join(f"paper: {c.header} | ours: {c.ours}" for c in self.columns)
        lines = [f"| method | {head} |", "|---|" + "---|---|" * len(self.columns)]
        for method, algorithm, suffix in self.methods:
            cells = []
            for c in self.columns:
                quoted = c.paper.get(method)
                rows = _line_rows(results, c.table, c.label + suffix, algorithm)
                finals = [r["final"] for r in rows]
                cells += [f"{quoted:.2f}" if quoted is not None else "–",
                          _pct(finals) if finals else "–"]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        tables = ", ".join(f"`{t}`" for t in dict.fromkeys(c.table for c in self.columns))
        lines += ["", f"Ours: final round, mean ± std over seeds, from the rows of {tables} "
                  "(`python -m benchmarks.reproduce run NAME`); a dash where a table is not "
                  "run yet or the method is not in it."]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class GridFigure(View):
    """The scenario grid in one picture: each method's final accuracy against the oracle's on
    every cell and seed, FedAvg's beside it. Drawn from the grid's rows into `image` (under
    docs/), and the page shows it."""
    name: str
    page: str
    image: str  # under docs/
    link: str  # the image as the page links it
    table: str = "scenario-grid"
    methods: tuple[str, ...] = ("incremental", "cfl")

    def render(self, results: Path) -> str:
        return (f"![Final accuracy of FedAvg and of the clustering methods against the "
                f"oracle's on every cell and seed of the scenario grid]({self.link})\n")

    def draw(self, results: Path) -> bytes:
        """The PNG, byte for byte the same for the same rows (no timestamp in it)."""
        import io

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        runs = {(r["cell"], r["algorithm"], r["seed"]): r
                for r in read_rows(results / f"{self.table}.jsonl")}
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
        styles = {"fedavg": ("FedAvg", "#bbbbbb", "o"), self.methods[0]: (
            self.methods[0], "#1f77b4", "o")} | {m: (m, "#ff7f0e", "x") for m in self.methods[1:]}
        for algorithm, (label, colour, marker) in styles.items():
            pairs = [(100 * runs[c, "oracle", s]["accuracy"], 100 * r["accuracy"])
                     for (c, a, s), r in sorted(runs.items())
                     if a == algorithm and (c, "oracle", s) in runs]
            if not pairs:  # no rows yet (a table's quick variant renders into a copy)
                continue
            ax.scatter(*zip(*pairs, strict=True), s=12, c=colour, marker=marker, label=label,
                       alpha=0.8, linewidths=1)
        ax.plot([10, 100], [10, 100], color="black", linewidth=0.8, linestyle="--")
        ax.set(xlabel="oracle (FedAvg inside each true group), final accuracy %",
               ylabel="final accuracy %", xlim=(55, 100), ylim=(10, 100),
               title="Scenario grid: 66 settings x 4 seeds, one default per method")
        if ax.collections:
            ax.legend(loc="upper left")
        fig.tight_layout()
        out = io.BytesIO()
        fig.savefig(out, format="png", metadata={"Software": None})
        plt.close(fig)
        return out.getvalue()
