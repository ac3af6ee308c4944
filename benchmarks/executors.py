"""Seconds per round of the sequential, batched and multi-process executors, side by side.

What it measures. For every (number of clients, executor) pair it runs a real experiment through
`fedflock.experiment.Run` (CFL on `mnist5k`, the small `cnn`, 1 local epoch, batch 25, lr 0.05,
4 label-permutation groups, evaluation every round, checkpoints every 10 rounds: the defaults a
user gets), in a fresh run directory, and reports per pair:

- seconds per round: the median over rounds 2.. of the *whole* round, i.e. everything the
  experiment loop does between the start of one round and the start of the next: configure,
  local training, aggregation (which includes CFL's similarity matrix and bipartition
  statistics), evaluation, building and writing the metrics line, and the checkpoint. Round 1
  is left out as warm-up (first forward passes, the worker pool's first task);
- the share of that round spent outside local training: 1 - sum(train) / sum(round) over the
  measured rounds;
- the start-up cost (from `Run.execute` to the start of round 1: data split, model, worker
  pool) and how much longer round 1 took than the median round.

How the rounds are timed. `metrics.jsonl` holds the phases the engine times (configure, train,
aggregate, evaluate) but not the bookkeeping after them, and `summary.json`'s `wall_seconds`
also covers start-up, the final fine-tune/evaluation and the summary, so neither gives the true
length of one round. The script therefore subclasses `Run` and timestamps the start of every
round (`Run._round`) and every checkpoint (`Run._checkpoint`): a round lasts from its own
start to the start of the next one, or to the end of its checkpoint for the last round (which
always writes one). The remainder after the four engine phases is reported as "log" (metrics
line, flush, progress). Checkpoints are written only every `checkpoint_every` (10) rounds, so
their measured cost is taken out of the round it fell in and added back divided by 10.

To bound the run time, a pair stops early (by raising out of `Run._round`; the engine still
closes its pool) once its measured rounds plus one more would exceed `--budget` seconds; at
least one round after the warm-up is always measured. `SampleReuseWarning`s (500 clients x 250
samples recycle the 4,000-sample pool) are silenced: they do not change the timing.

Run (about 7 minutes on 2 idle cores for the default grid):

    .venv/bin/python benchmarks/executors.py
    .venv/bin/python benchmarks/executors.py --clients 20 --executors sequential,processes \\
        --rounds 5 --out runs/bench-executors

Results are also written to `<out>/executors.json` (and with `--rows FILE` one line per client
count, what the `executors` table of benchmarks/reproduce.py renders); the run directories
stay under `<out>`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedflock.algorithms import Algorithm
from fedflock.client.executors import EXECUTORS, available_cores
from fedflock.config import ExperimentConfig
from fedflock.data.datasets import load_dataset
from fedflock.data.scenarios import SampleReuseWarning
from fedflock.engines.embedded import EmbeddedEngine
from fedflock.experiment import Run
from fedflock.validation import validate

DATASET = "mnist5k"
PHASES = ("configure", "train", "aggregate", "evaluate")
OUTSIDE = ("configure", "aggregate", "evaluate", "log", "checkpoint")


def make_config(clients: int, executor: str, rounds: int, samples: int,
                workers: int | None) -> ExperimentConfig:
    return validate({
        "seed": 0,
        "rounds": rounds,
        "data": {"dataset": DATASET, "clients": clients, "samples_per_client": samples,
                 "scenario": {"kind": "label_permutation", "groups": 4}},
        "model": {"name": "cnn"},
        "training": {"local_epochs": 1, "batch_size": 25, "lr": 0.05, "executor": executor,
                     "workers": workers},
        "algorithm": {"name": "cfl"},
    })


class _Enough(Exception):
    """Raised out of `Run._round` when a pair has used its time budget."""


class TimedRun(Run):
    """A `Run` that timestamps round starts and checkpoints, and may stop after a budget."""

    def __init__(self, config: ExperimentConfig, out: Path, budget: float) -> None:
        super().__init__(config, out, quiet=True)
        self.budget = budget
        self.started = 0.0
        self.round_starts: dict[int, float] = {}
        self.round_ends: dict[int, float] = {}
        self.checkpoints: dict[int, float] = {}  # round -> seconds spent saving

    def execute(self, resume: bool = False) -> dict[str, Any]:
        self.started = time.perf_counter()
        return super().execute(resume)

    def _round(self, engine: EmbeddedEngine, algorithm: Algorithm, objective: Any, rnd: int,
               evaluation: Any) -> tuple[dict[str, Any], Any]:
        now = time.perf_counter()
        if rnd - 1 in self.round_starts and rnd - 1 not in self.round_ends:
            self.round_ends[rnd - 1] = now
        totals = [self.round_ends[r] - self.round_starts[r] for r in sorted(self.round_ends)]
        if len(totals) >= 2 and sum(totals[1:]) + totals[-1] > self.budget:
            raise _Enough
        self.round_starts[rnd] = now
        return super()._round(engine, algorithm, objective, rnd, evaluation)

    def _checkpoint(self, rnd: int, algorithm: Algorithm, engine: EmbeddedEngine,
                    elapsed: float) -> None:
        t0 = time.perf_counter()
        super()._checkpoint(rnd, algorithm, engine, elapsed)
        t1 = time.perf_counter()
        self.checkpoints[rnd] = t1 - t0
        if rnd == self.config.rounds:  # nothing but the final evaluation follows
            self.round_ends[rnd] = t1


@dataclass
class Result:
    clients: int
    executor: str
    rounds_run: int = 0
    rounds_measured: int = 0
    seconds_per_round: float | None = None
    train_seconds: float | None = None
    outside_share: float | None = None
    breakdown: dict[str, float] = field(default_factory=dict)  # median seconds per phase
    startup_seconds: float | None = None
    warmup_excess_seconds: float | None = None
    checkpoint_seconds: float | None = None  # one save, not amortised
    load_average: float | None = None
    error: str | None = None


def measure(clients: int, executor: str, args: argparse.Namespace, out: Path) -> Result:
    result = Result(clients, executor)
    config = make_config(clients, executor, args.rounds, args.samples, args.workers)
    run = TimedRun(config, Path(tempfile.mkdtemp(prefix=f"c{clients}-{executor}-", dir=out)),
                   args.budget)
    try:
        run.execute()
    except _Enough:
        pass
    except Exception as exc:  # one failing pair must not lose the others
        result.error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
        return result
    finally:
        result.load_average = round(os.getloadavg()[0], 2)
    records = {}
    with (run.out / "metrics.jsonl").open() as fh:
        for line in fh:
            record = json.loads(line)
            records[record["round"]] = record["timing"]
    every = config.checkpoint_every
    saves = list(run.checkpoints.values())
    per_save = statistics.mean(saves) if saves else 0.0
    rows: list[dict[str, float]] = []
    for rnd in sorted(run.round_ends):
        timing = records[rnd]
        own_save = run.checkpoints.get(rnd, 0.0)
        total = run.round_ends[rnd] - run.round_starts[rnd] - own_save + per_save / every
        row = {p: float(timing.get(p, 0.0)) for p in PHASES}
        row["checkpoint"] = per_save / every
        row["log"] = max(0.0, total - sum(row.values()))
        row["total"] = total
        rows.append(row)
    measured = rows[1:] if len(rows) > 1 else rows
    result.rounds_run = len(rows)
    result.rounds_measured = len(measured)
    result.seconds_per_round = statistics.median(r["total"] for r in measured)
    result.train_seconds = statistics.median(r["train"] for r in measured)
    result.outside_share = 1.0 - sum(r["train"] for r in measured) / sum(
        r["total"] for r in measured)
    keys = dict.fromkeys((*PHASES, *OUTSIDE))
    result.breakdown = {k: statistics.median(r[k] for r in measured) for k in keys}
    result.startup_seconds = run.round_starts[1] - run.started
    result.warmup_excess_seconds = rows[0]["total"] - result.seconds_per_round
    result.checkpoint_seconds = per_save if saves else None
    return result


def auto_pick(clients: int, workers: int | None) -> str:
    """What `training.executor: auto` resolves to (the rule of `choose_executor`, for a model
    without BatchNorm buffers such as `cnn`), without starting a worker pool."""
    if torch.cuda.is_available():
        return "batched"
    if (workers or available_cores()) >= 2 and clients >= 4:
        return "processes"
    return "sequential"


def machine_facts(workers: int | None) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "available_cores": available_cores(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "process_workers": workers or available_cores(),
        "cuda": torch.cuda.is_available(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or not np.isfinite(value) else format(value, spec)


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    print(line)
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


def report(results: list[Result], clients: list[int], executors: list[str],
           workers: int | None) -> None:
    by_key = {(r.clients, r.executor): r for r in results}
    header = ["clients", *[f"{e} s/rnd" for e in executors], "fastest", "auto",
              *[f"{e} outside" for e in executors]]
    rows = []
    for n in clients:
        cells = [by_key[(n, e)] for e in executors]
        timed = [(c.seconds_per_round, c.executor) for c in cells
                 if c.seconds_per_round is not None]
        fastest = min(timed)[1] if timed else "-"
        rows.append([str(n), *[_fmt(c.seconds_per_round, ".3f") for c in cells], fastest,
                     auto_pick(n, workers), *[_fmt(
                         None if c.outside_share is None else 100 * c.outside_share, ".1f") + "%"
                         for c in cells]])
    print("\nSeconds per round (median of rounds >= 2) and share of the round outside training")
    print_table(header, rows)

    header = ["clients", "executor", "rounds", "round s", "train", "configure", "aggregate",
              "evaluate", "log", "ckpt/10", "outside", "start-up s", "round-1 extra s", "load"]
    rows = []
    for r in results:
        if r.error:
            rows.append([str(r.clients), r.executor, "-", "error: " + r.error[:60],
                         *["-"] * (len(header) - 4)])
            continue
        b = r.breakdown
        rows.append([str(r.clients), r.executor, f"{r.rounds_measured}/{r.rounds_run}",
                     _fmt(r.seconds_per_round, ".3f"),
                     *[_fmt(b[k], ".4f") for k in ("train", "configure", "aggregate", "evaluate",
                                                   "log", "checkpoint")],
                     _fmt(100 * (r.outside_share or 0.0), ".1f") + "%",
                     _fmt(r.startup_seconds, ".2f"), _fmt(r.warmup_excess_seconds, ".2f"),
                     _fmt(r.load_average, ".2f")])
    print("\nMedian seconds per phase (rounds: measured/run; ckpt/10: one checkpoint spread over"
          " the 10 rounds between two; load: 1-min load average when the pair ended)")
    print_table(header, rows)
    failed = [r for r in results if r.error]
    for r in failed:
        print(f"\n{r.clients} clients, {r.executor}: {r.error}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="20,100,500", help="comma-separated client counts")
    parser.add_argument("--executors", default="sequential,batched,processes",
                        help="comma-separated executors")
    parser.add_argument("--rounds", type=int, default=4,
                        help="rounds per pair, the first one being warm-up (default 4)")
    parser.add_argument("--samples", type=int, default=250, help="training samples per client")
    parser.add_argument("--budget", type=float, default=45.0,
                        help="stop a pair early once its measured rounds would pass this many "
                             "seconds (at least one is measured; default 45)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of the main process, which runs the sequential and "
                             "batched executors and all evaluation (default: torch's own)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes of the multi-process executor (default: available cores)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for executors.json and the run directories (default: temp)")
    parser.add_argument("--rows", type=Path, default=None,
                        help="also write one JSON line per client count here (the `executors` "
                             "table of benchmarks/reproduce.py is rendered from them)")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is warm-up)")
    unknown = [e for e in args.executors.split(",") if e.strip() not in EXECUTORS]
    if unknown:
        parser.error(f"--executors: unknown {', '.join(unknown)} (expected some of: "
                     f"{', '.join(EXECUTORS)})")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    clients = [int(x) for x in args.clients.split(",")]
    executors = [x.strip() for x in args.executors.split(",")]
    out = args.out or Path(tempfile.mkdtemp(prefix="fedflock-bench-executors-"))
    out.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore", SampleReuseWarning)
    if args.threads:
        torch.set_num_threads(args.threads)

    facts = machine_facts(args.workers)
    print("machine: " + ", ".join(f"{k}={v}" for k, v in facts.items()))
    t0 = time.perf_counter()
    load_dataset(DATASET, None)  # decode once, so no pair pays for it
    facts["dataset_load_seconds"] = round(time.perf_counter() - t0, 3)
    print(f"workload: CFL, {DATASET}, cnn, 1 local epoch, batch 25, {args.samples} samples/client,"
          f" {args.rounds} rounds per pair (round 1 = warm-up), budget {args.budget:g} s per pair;"
          f" dataset decoded in {facts['dataset_load_seconds']} s", flush=True)

    results: list[Result] = []
    started = time.perf_counter()
    for n in clients:
        for executor in executors:
            t = time.perf_counter()
            result = measure(n, executor, args, out)
            results.append(result)
            status = result.error or (f"{result.seconds_per_round:.3f} s/round over "
                                      f"{result.rounds_measured} round(s), outside training "
                                      f"{100 * (result.outside_share or 0):.1f}%")
            print(f"  {n:4d} clients  {executor:<10s} {status}  "
                  f"[{time.perf_counter() - t:.1f} s, load {result.load_average}]", flush=True)
    total = time.perf_counter() - started
    facts["load_average_end"] = [round(x, 2) for x in os.getloadavg()]

    report(results, clients, executors, args.workers)
    print(f"\ntotal {total:.1f} s; load average at start {facts['load_average_start']}, "
          f"at end {facts['load_average_end']}")
    path = out / "executors.json"
    path.write_text(json.dumps({"machine": facts, "args": {k: str(v) for k, v in
                                                          vars(args).items()},
                                "total_seconds": round(total, 2),
                                "auto": {str(n): auto_pick(n, args.workers) for n in clients},
                                "results": [asdict(r) for r in results]}, indent=2) + "\n")
    print(f"results: {path}")
    if args.rows:
        write_rows(args.rows, results, clients, executors, args.workers, facts)


def write_rows(path: Path, results: list[Result], clients: list[int], executors: list[str],
               workers: int | None, facts: dict[str, Any]) -> None:
    """One line per client count: each executor's seconds per round and outside share (NaN
    where a pair failed), the fastest, what `auto` picks, and the machine."""
    by_key = {(r.clients, r.executor): r for r in results}
    machine = {"cores": facts["available_cores"], "torch_threads": facts["torch_threads"],
               "process_workers": facts["process_workers"],
               "load_average": facts["load_average_start"][0]}
    with path.open("a") as fh:
        for n in clients:
            row: dict[str, Any] = {"clients": n, "auto": auto_pick(n, workers),
                                   "machine": machine}
            timed = []
            for e in executors:
                r = by_key[(n, e)]
                row[f"{e}_seconds"] = r.seconds_per_round or float("nan")
                row[f"{e}_outside"] = 100 * r.outside_share if r.outside_share is not None \
                    else float("nan")
                if r.seconds_per_round is not None:
                    timed.append((r.seconds_per_round, e))
            row["fastest"] = min(timed)[1] if timed else "-"
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
