"""An experiment: build the engine and the algorithm from a config and run the round loop.

The run directory (`fedflock.rundir`) keeps what is written; the summaries
(`fedflock.summary`) say what is reported; this module only drives the rounds.
"""

from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from fedflock.algorithms import ALGORITHMS, Algorithm, AlgorithmContext, validate_params
from fedflock.client.objectives import get_objective
from fedflock.config import ExperimentConfig, ParticipationConfig, dump_config
from fedflock.data.poisoning import malicious_clients
from fedflock.engines.base import Engine
from fedflock.engines.embedded import EmbeddedEngine
from fedflock.errors import ConfigError, FedflockError
from fedflock.plugins import named_plugins
from fedflock.robust import Adversary
from fedflock.rundir import RunDirectory
from fedflock.summary import (
    Evaluation,
    ari,
    attack_summary,
    partition_labels,
    round_record,
    summarise_run,
)
from fedflock.validation import resolved

TIMING_KEYS = ("wall_seconds", "rounds_per_second", "timing")


def sample_clients(num_clients: int, participation: ParticipationConfig, seed: int,
                   rnd: int) -> list[int]:
    """The clients taking part in round `rnd` (seeded, uniform without replacement)."""
    k = participation.per_round(num_clients)
    if k >= num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng([seed, 2, rnd])
    return sorted(rng.choice(num_clients, size=k, replace=False).tolist())


def round_clients(algorithm: Algorithm, num_clients: int, config: ExperimentConfig,
                  rnd: int) -> list[int]:
    """The clients of round `rnd`: the run's seeded sample, as the algorithm amends it."""
    return algorithm.participants(rnd, sample_clients(num_clients, config.participation,
                                                      config.seed, rnd))


def build_algorithm(config: ExperimentConfig, engine: Engine) -> Algorithm:
    """The configured algorithm over this engine's federation, with its context."""
    cls = ALGORITHMS.get(config.algorithm.name)
    params = validate_params(config.algorithm)
    model = engine.model_handle()
    if cls.needs_model and model is None:
        raise ConfigError(f"config: privacy.masking: algorithm {cls.name!r} needs the model "
                          "layout, which masking hides from the server")
    context = AlgorithmContext(
        num_clients=engine.num_clients, initial=engine.initial_models(1)[0],
        update_size=engine.update_size, seed=config.seed, model=model,
        data_spec=engine.data_spec, dataset=config.data.dataset,
        make_initial_models=engine.initial_models,
        true_groups=engine.true_groups if cls.uses_ground_truth else None)
    return cls(params, context)


class Run:
    """One run of one config into one directory; `execute` is resumable."""

    def __init__(self, config: ExperimentConfig, out: Path, quiet: bool = False) -> None:
        self.config = config
        self.out = Path(out)
        self.dir = RunDirectory(self.out)
        self.quiet = quiet
        self.evaluated_round: int | None = None  # the round the latest evaluation comes from

    def execute(self, resume: bool = False, engine: Engine | None = None) -> dict[str, Any]:
        """Run (or continue) the experiment; `engine` defaults to the embedded one."""
        cfg = self.config
        if engine is None and cfg.engine == "flower":
            raise FedflockError("engine 'flower' runs through Flower: `run_experiment` "
                                "(simulation) or `flwr run \"$(fedflock flower-app)\"` "
                                "(docs/deploying.md)")
        engine = engine or EmbeddedEngine.from_config(cfg)
        engine.norm_bound = cfg.server.norm_bound
        try:  # every config error is raised before the run directory is touched
            algorithm = build_algorithm(cfg, engine)
            with self.dir.locked():
                return self._execute(engine, algorithm, resume)
        finally:
            engine.close()

    def _execute(self, engine: Engine, algorithm: Algorithm, resume: bool) -> dict[str, Any]:
        cfg = self.config
        objective = get_objective(engine.data_spec.objective)
        malicious = malicious_clients(cfg.attack, engine.num_clients, cfg.seed)
        if cfg.attack is not None and cfg.attack.poisons_model:
            engine.adversary = Adversary(cfg.attack, malicious, cfg.seed, engine.update_size)
        restore = self.dir.prepare(dump_config(resolved(cfg)), resume)
        if engine.tokenizer is not None:
            self.dir.write_tokenizer(engine.tokenizer)
        start_round, elapsed = self._restore(algorithm, engine) if restore else (0, 0.0)
        evaluation: Evaluation = {}
        t_start = time.perf_counter() - elapsed
        round_seconds = train_seconds = 0.0  # rounds run by this process (not before a resume)
        before_final_tasks = False  # nobody answered the evaluation after the final tasks
        try:
            with self._progress() as progress:
                task = progress.add_task(cfg.algorithm.name, total=cfg.rounds,
                                         completed=start_round) if progress else None
                with self.dir.metrics_log() as log:
                    for rnd in range(start_round + 1, cfg.rounds + 1):
                        t_round = time.perf_counter()
                        record, evaluation = self._round(engine, algorithm, objective, rnd,
                                                         evaluation)
                        log.write(record)
                        self._write_matrices(algorithm)
                        if rnd % cfg.checkpoint_every == 0 or rnd == cfg.rounds:
                            self._checkpoint(rnd, algorithm, engine, time.perf_counter() - t_start)
                        round_seconds += time.perf_counter() - t_round
                        train_seconds += record["timing"]["train"]
                        if progress:
                            primary = record.get(f"{objective.primary}_mean") or 0
                            progress.update(task, advance=1, description=(
                                f"{cfg.algorithm.name} {objective.primary}={primary:.3f} "
                                f"k={algorithm.num_clusters()}"))
            finished = engine.finish(algorithm, cfg.rounds, list(range(engine.num_clients)))
            if finished or not evaluation:  # the last round's evaluation is still current
                fresh = engine.evaluate(algorithm, cfg.rounds)
                if fresh:
                    evaluation, self.evaluated_round = fresh, cfg.rounds
                elif finished:  # the figures predate the final tasks (e.g. fine-tuning)
                    before_final_tasks = True
            if not evaluation:
                raise FedflockError(
                    f"no client answered an evaluation in {cfg.rounds} rounds: nothing to "
                    f"summarise (metrics.jsonl and the checkpoint in {self.dir.path} are kept)")
            attack = attack_summary(cfg, algorithm, engine, evaluation, objective, malicious)
            alternatives = {name: engine.evaluate(algorithm, cfg.rounds, task_of) for name, task_of
                            in algorithm.alternative_evaluations().items()}
        finally:
            engine.close()
        wall = time.perf_counter() - t_start
        summary = summarise_run(cfg, algorithm, engine, evaluation, objective, wall,
                                alternatives)
        if self.evaluated_round not in (None, cfg.rounds):  # the last evaluation went unanswered
            summary["evaluated_round"] = self.evaluated_round
        if before_final_tasks:
            summary["evaluated_before_final_tasks"] = True
        if attack is not None:
            summary["attack"] = attack
        if round_seconds > 0:
            summary["timing"] = {
                "round_seconds": round(round_seconds, 3),
                "train_seconds": round(train_seconds, 3),
                "outside_training_share": round(1 - train_seconds / round_seconds, 4),
            }
        self._write_matrices(algorithm)
        self.dir.write_summary(summary)
        return summary

    def _write_matrices(self, algorithm: Algorithm) -> None:
        """Move the similarity matrices of new decisions to splits/ (out of memory and out of
        every later checkpoint)."""
        for index, members, matrix in algorithm.take_matrices():
            self.dir.write_matrix(index, members, matrix)

    def _checkpoint(self, rnd: int, algorithm: Algorithm, engine: Engine,
                    elapsed: float) -> None:
        self.dir.save_checkpoint({
            "round": rnd, "algorithm_name": algorithm.name, "algorithm": algorithm.state_dict(),
            "elapsed": elapsed, "communication": engine.communication,
            "missing": engine.missing, "rejected": engine.rejected})

    def _restore(self, algorithm: Algorithm, engine: Engine) -> tuple[int, float]:
        state = self.dir.load_checkpoint(algorithm.name)
        try:
            algorithm.load_state_dict(state["algorithm"])
            engine.communication = dict(state["communication"])
            engine.missing = {int(c): list(r) for c, r in state["missing"].items()}
            engine.rejected = list(state["rejected"])
            return state["round"], float(state["elapsed"])
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
            raise FedflockError(f"{self.dir.checkpoint_path}: does not hold a state of "
                                f"{algorithm.name!r} ({type(err).__name__}: {err})") from None

    def _round(self, engine: Engine, algorithm: Algorithm, objective: Any, rnd: int,
               evaluation: Evaluation) -> tuple[dict[str, Any], Evaluation]:
        cfg = self.config
        clients = round_clients(algorithm, engine.num_clients, cfg, rnd)
        scheduled = rnd % cfg.eval_every == 0 or rnd == cfg.rounds
        with_training = scheduled and rnd < cfg.rounds and (
            cfg.eval_mode == "with_training"
            or (cfg.eval_mode == "auto" and engine.pays_per_message))
        diagnostics, timing, received = engine.train_round(algorithm, rnd, clients,
                                                           evaluate=with_training)
        record: dict[str, Any] = {"round": rnd, "participants": len(clients)}
        t0 = time.perf_counter()
        if with_training:  # the sampled clients' received models, scored before training
            record["evaluated"] = "received"
            if received:
                record.update(round_record(received, objective),
                              evaluated_clients=sorted(received))
        elif scheduled:
            fresh = engine.evaluate(algorithm, rnd)
            if fresh:
                evaluation, self.evaluated_round = fresh, rnd
            elif evaluation:  # nobody answered: the figures are an earlier round's, said so
                record["evaluated_round"] = self.evaluated_round
            if evaluation:
                record.update(round_record(evaluation, objective))
        timing["evaluate"] = time.perf_counter() - t0
        assignment = partition_labels(algorithm.clusters(), engine.num_clients)
        groups = engine.true_groups
        if groups is not None:
            record["ari"] = ari(groups, assignment)
            waiting = set(algorithm.unplaced())
            if waiting:  # how well the clients placed so far are grouped
                placed = [c for c in range(engine.num_clients) if c not in waiting]
                record["ari_placed"] = ari(groups[placed], assignment[placed]) if placed else None
        record.update(diagnostics, num_clusters=algorithm.num_clusters(),
                      assignment=assignment.tolist(),
                      timing={k: round(v, 5) for k, v in timing.items()})
        return record, evaluation

    def _progress(self):
        if self.quiet:
            return nullcontext(None)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        return Progress("[progress.description]{task.description}", BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), transient=False)


def run_experiment(config: ExperimentConfig, out: Path, resume: bool = False,
                   quiet: bool = False) -> dict[str, Any]:
    """Run one experiment into `out`: on the embedded engine, or with `engine: flower` through
    Flower's simulation runtime (`flwr run`), with the plugins loaded here."""
    if config.engine == "flower":
        from fedflock.engines.flower.simulation import simulate

        check_run_directory(config, out, resume)  # before Flower's start-up, not after it
        return simulate(config, out, resume, plugins=named_plugins())
    return Run(config, out, quiet).execute(resume)


def check_run_directory(config: ExperimentConfig, out: Path, resume: bool = False) -> bool:
    """Raise the one-line refusal a run of `config` into `out` would meet, writing nothing;
    True when it would continue from a checkpoint. Its warnings are left to the run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return RunDirectory(out).check_start(dump_config(resolved(config)), resume)


def without_timings(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary minus the fields that legitimately differ between identical runs."""
    return {k: v for k, v in summary.items() if k not in TIMING_KEYS}
