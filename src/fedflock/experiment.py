"""An experiment: build data, clients, algorithm and engine from a config, run the rounds, and
write the run directory (config.yaml, metrics.jsonl, summary.json, checkpoints/, splits/).
"""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score

from fedflock.algorithms import ALGORITHMS, Algorithm, validate_params
from fedflock.config import ExperimentConfig, ParticipationConfig, dump_config
from fedflock.engines.base import Engine
from fedflock.engines.embedded import EmbeddedEngine
from fedflock.errors import FedflockError
from fedflock.robust import Adversary, malicious_clients

TIMING_KEYS = ("wall_seconds", "rounds_per_second", "timing")


def sample_clients(num_clients: int, participation: ParticipationConfig, seed: int,
                   rnd: int) -> list[int]:
    """The clients taking part in round `rnd` (seeded, uniform without replacement)."""
    k = participation.per_round(num_clients)
    if k >= num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng([seed, 2, rnd])
    return sorted(rng.choice(num_clients, size=k, replace=False).tolist())


def partition_labels(clusters: list[list[int]], num_clients: int) -> np.ndarray:
    labels = np.empty(num_clients, dtype=int)
    for k, members in enumerate(clusters):
        labels[members] = k
    return labels


def build_algorithm(config: ExperimentConfig, engine: Engine) -> Algorithm:
    cls = ALGORITHMS.get(config.algorithm.name)
    params = validate_params(config.algorithm)
    if getattr(cls, "needs_true_groups", False) and getattr(params, "clusters", 0) is None:
        groups = engine.true_groups
        if groups is None:
            raise FedflockError("algorithm 'oracle' needs the true groups, which this "
                                "federation does not report")
        clusters = [np.flatnonzero(groups == g).tolist() for g in np.unique(groups)]
        params = params.model_copy(update={"clusters": clusters})
    return cls(params, engine.num_clients, engine.initial_params(), engine.update_size)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


class Run:
    """One run of one config into one directory; `execute` is resumable."""

    def __init__(self, config: ExperimentConfig, out: Path, quiet: bool = False) -> None:
        self.config = config
        self.out = Path(out)
        self.quiet = quiet

    # -- run directory -------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.out / "checkpoints" / "last.pt"

    def _prepare_dir(self, resume: bool) -> None:
        if resume:
            if not self.checkpoint_path.is_file():
                raise FedflockError(f"--resume: no checkpoint in {self.out / 'checkpoints'}")
            saved = (self.out / "config.yaml").read_text()
            if saved != dump_config(self.config):
                raise FedflockError(f"--resume: config differs from {self.out / 'config.yaml'}")
            return
        if (self.out / "metrics.jsonl").exists():
            raise FedflockError(
                f"run directory {self.out} already holds a run; use --resume or another --out"
            )
        (self.out / "checkpoints").mkdir(parents=True, exist_ok=True)
        (self.out / "config.yaml").write_text(dump_config(self.config))

    def _save_checkpoint(self, rnd: int, algorithm: Algorithm, engine: Engine,
                         elapsed: float) -> None:
        tmp = self.checkpoint_path.with_suffix(".tmp")
        torch.save({"round": rnd, "algorithm": algorithm.state_dict(), "elapsed": elapsed,
                    "communication": engine.communication}, tmp)
        tmp.replace(self.checkpoint_path)

    def _restore(self, algorithm: Algorithm, engine: Engine) -> tuple[int, float]:
        state = torch.load(self.checkpoint_path, weights_only=False)
        algorithm.load_state_dict(state["algorithm"])
        engine.communication = dict(state.get("communication", engine.communication))
        done = state["round"]
        metrics = self.out / "metrics.jsonl"
        if metrics.exists():  # drop rounds logged after the checkpoint
            lines = [ln for ln in metrics.read_text().splitlines()
                     if ln and json.loads(ln)["round"] <= done]
            metrics.write_text("".join(ln + "\n" for ln in lines))
        return done, state.get("elapsed", 0.0)

    # -- the loop ------------------------------------------------------------------------
    def execute(self, resume: bool = False, engine: Engine | None = None) -> dict[str, Any]:
        """Run (or continue) the experiment; `engine` defaults to the embedded one."""
        cfg = self.config
        if engine is None and cfg.engine == "flower":
            raise FedflockError("engine 'flower' runs through Flower: `fedflock run` (simulation) "
                                "or `flwr run examples/flower-deployment` (see README)")
        engine = engine or EmbeddedEngine.from_config(cfg)
        malicious = malicious_clients(cfg.attack, engine.num_clients, cfg.seed)
        if cfg.attack is not None and cfg.attack.poisons_model:
            engine.adversary = Adversary(cfg.attack, malicious, cfg.seed, engine.update_size)
        try:
            algorithm = build_algorithm(cfg, engine)
            self._prepare_dir(resume)
            start_round, elapsed = self._restore(algorithm, engine) if resume else (0, 0.0)
        except BaseException:
            engine.close()
            raise
        evaluation: dict[int, tuple[float, float]] = {}
        t_start = time.perf_counter() - elapsed
        round_seconds = train_seconds = 0.0  # rounds run by this process (not before a resume)
        try:
            with self._progress() as progress:
                task = progress.add_task(cfg.algorithm.name, total=cfg.rounds,
                                         completed=start_round) if progress else None
                with (self.out / "metrics.jsonl").open("a") as log:
                    for rnd in range(start_round + 1, cfg.rounds + 1):
                        t_round = time.perf_counter()
                        record, evaluation = self._round(engine, algorithm, rnd, evaluation)
                        log.write(json.dumps(record) + "\n")
                        log.flush()
                        if rnd % cfg.checkpoint_every == 0 or rnd == cfg.rounds:
                            self._save_checkpoint(rnd, algorithm, engine,
                                                  time.perf_counter() - t_start)
                        round_seconds += time.perf_counter() - t_round
                        train_seconds += record["timing"]["train"]
                        if progress:
                            progress.update(task, advance=1, description=(
                                f"{cfg.algorithm.name} acc={record.get('accuracy_mean', 0):.3f} "
                                f"k={algorithm.num_clusters()}"))
            finished = engine.finish(algorithm, cfg.rounds, list(range(engine.num_clients)))
            if finished or not evaluation:  # the last round's evaluation is still current
                evaluation = engine.evaluate(algorithm)
            attack = self._attack_summary(algorithm, engine, evaluation, malicious)
        finally:
            engine.close()
        wall = time.perf_counter() - t_start
        summary = self._summary(algorithm, engine, evaluation, wall)
        if attack is not None:
            summary["attack"] = attack
        if round_seconds > 0:
            summary["timing"] = {
                "round_seconds": round(round_seconds, 3),
                "train_seconds": round(train_seconds, 3),
                "outside_training_share": round(1 - train_seconds / round_seconds, 4),
            }
        self._write_splits(algorithm)
        _write_json(self.out / "summary.json", summary)
        return summary

    def _round(self, engine: Engine, algorithm: Algorithm, rnd: int,
               evaluation: dict[int, tuple[float, float]]
               ) -> tuple[dict[str, Any], dict[int, tuple[float, float]]]:
        cfg = self.config
        clients = sample_clients(engine.num_clients, cfg.participation, cfg.seed, rnd)
        diagnostics, timing = engine.train_round(algorithm, rnd, clients)
        record: dict[str, Any] = {"round": rnd, "participants": len(clients)}
        t0 = time.perf_counter()
        if rnd % cfg.eval_every == 0 or rnd == cfg.rounds:
            evaluation = engine.evaluate(algorithm) or evaluation
            accs = [a for a, _ in evaluation.values()]
            record.update(
                accuracy_mean=round(float(np.mean(accs)), 6),
                accuracy_worst=round(float(np.min(accs)), 6),
                accuracy=[round(evaluation[c][0], 6) for c in sorted(evaluation)],
                test_loss=round(float(np.mean([lo for _, lo in evaluation.values()])), 6),
            )
        timing["evaluate"] = time.perf_counter() - t0
        clusters = algorithm.clusters()
        assignment = partition_labels(clusters, engine.num_clients)
        if engine.true_groups is not None:
            record["ari"] = round(float(adjusted_rand_score(engine.true_groups, assignment)), 6)
            waiting = set(algorithm.unplaced())
            if waiting:  # how well the clients placed so far are grouped
                placed = [c for c in range(engine.num_clients) if c not in waiting]
                record["ari_placed"] = round(float(adjusted_rand_score(
                    engine.true_groups[placed], assignment[placed])), 6) if placed else None
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

    def _summary(self, algorithm: Algorithm, engine: Engine,
                 evaluation: dict[int, tuple[float, float]], wall: float) -> dict[str, Any]:
        cfg = self.config
        clusters = algorithm.clusters()
        labels = partition_labels(clusters, engine.num_clients)
        groups = engine.true_groups
        accs = [evaluation[c][0] for c in sorted(evaluation)]
        summary: dict[str, Any] = {
            "algorithm": cfg.algorithm.name,
            "dataset": cfg.data.dataset,
            "scenario": cfg.data.scenario.kind,
            "seed": cfg.seed,
            "rounds": cfg.rounds,
            "num_clients": engine.num_clients,
            "engine": engine.name,
            "clusters": clusters,
            "num_clusters": algorithm.num_clusters(),
            "true_groups": None if groups is None else groups.tolist(),
            "ari": None if groups is None
            else round(float(adjusted_rand_score(groups, labels)), 6),
            "accuracy": {
                "mean": round(float(np.mean(accs)), 6),
                "worst": round(float(np.min(accs)), 6),
                "per_client": [round(evaluation[c][0], 6) if c in evaluation else None
                               for c in range(engine.num_clients)],
            },
            "splits": algorithm.splits,
            "tree": algorithm.tree(),
            "executor": engine.executor_name,
            "participation": {"per_round": cfg.participation.per_round(engine.num_clients)},
            "communication": dict(engine.communication),
            "wall_seconds": round(wall, 3),
            "rounds_per_second": round(cfg.rounds / wall, 4) if wall > 0 else None,
        }
        if engine.missing or engine.rejected:
            summary["missing_rounds"] = {str(c): r for c, r in sorted(engine.missing.items())}
            summary["rejected_replies"] = engine.rejected
        return summary

    def _attack_summary(self, algorithm: Algorithm, engine: Engine,
                        evaluation: dict[int, tuple[float, float]], malicious: list[int]
                        ) -> dict[str, Any] | None:
        """Who attacked, what each cluster holds, and how the benign clients fare: accuracy of
        their own (cluster) models and, for label-flipping attacks, the attack success rate."""
        attack = self.config.attack
        if attack is None:
            return None
        bad = set(malicious)
        benign = [c for c in sorted(evaluation) if c not in bad]
        clusters = []
        for k, members in enumerate(algorithm.clusters()):
            accs = [evaluation[c][0] for c in members if c in evaluation]
            clusters.append({"cluster": k, "size": len(members),
                             "malicious": sum(c in bad for c in members),
                             "accuracy": round(float(np.mean(accs)), 6) if accs else None})
        # The cluster serving the most benign clients; judged with the ground truth, for
        # evaluation only (no algorithm needs it: each client uses its own cluster's model).
        benign_cluster = max(clusters, key=lambda c: (c["size"] - c["malicious"], -c["cluster"]))
        out: dict[str, Any] = {
            **attack.model_dump(mode="json", exclude={"label_map"}),
            "malicious": malicious,
            "benign_accuracy": round(float(np.mean([evaluation[c][0] for c in benign])), 6)
            if benign else None,
            "clusters": clusters,
            "benign_cluster": {**benign_cluster,
                               "judged_by": "most benign members (ground truth, evaluation only)"},
        }
        if attack.poisons_data:
            counts = engine.attack_success({c: algorithm.model_of(c) for c in benign},
                                           attack.label_map)
            if counts is not None:
                hits, total = (sum(v[i] for v in counts.values()) for i in (0, 1))
                out["attack_success_rate"] = round(hits / total, 6) if total else None
        return out

    def _write_splits(self, algorithm: Algorithm) -> None:
        if not algorithm.split_matrices:
            return
        folder = self.out / "splits"
        folder.mkdir(exist_ok=True)
        for i, (members, matrix) in enumerate(algorithm.split_matrices):
            np.savez(folder / f"split_{i:02d}.npz", members=np.asarray(members),
                     similarity=np.asarray(matrix))


def run_experiment(config: ExperimentConfig, out: Path, resume: bool = False,
                   quiet: bool = False) -> dict[str, Any]:
    return Run(config, out, quiet).execute(resume)


def without_timings(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary minus the fields that legitimately differ between identical runs."""
    return {k: v for k, v in summary.items() if k not in TIMING_KEYS}
