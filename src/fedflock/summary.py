"""What a run reports: per-round evaluation records and the final summary.json.

Evaluation is named metrics per client; the objective says which is primary and which way is
better, so nothing here knows whether a run scores accuracy or perplexity.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.metrics import adjusted_rand_score

from fedflock.algorithms.base import Algorithm
from fedflock.client.objectives import Objective
from fedflock.config import ExperimentConfig
from fedflock.engines.base import Engine
from fedflock.privacy.dp import accounting, releases_of

Evaluation = dict[int, dict[str, float]]  # client -> metric -> value


def partition_labels(clusters: list[list[int]], num_clients: int) -> np.ndarray:
    labels = np.empty(num_clients, dtype=int)
    for k, members in enumerate(clusters):
        labels[members] = k
    return labels


def ari(groups: np.ndarray | None, labels: np.ndarray) -> float | None:
    return None if groups is None else round(float(adjusted_rand_score(groups, labels)), 6)


def primary_values(evaluation: Evaluation, objective: Objective) -> list[float]:
    return [evaluation[c][objective.primary] for c in sorted(evaluation)]


def round_record(evaluation: Evaluation, objective: Objective) -> dict[str, Any]:
    """`<primary>_mean`, `<primary>_worst`, the per-client `<primary>` list and `test_<other>`
    means (classification: accuracy_mean, accuracy_worst, accuracy, test_loss)."""
    p = objective.primary
    values = primary_values(evaluation, objective)
    record: dict[str, Any] = {f"{p}_mean": round(float(np.mean(values)), 6),
                              f"{p}_worst": round(float(objective.worst(values)), 6),
                              p: [round(v, 6) for v in values]}
    for m in objective.metrics:
        if m != p:
            record[f"test_{m}"] = round(float(np.mean([e[m] for e in evaluation.values()])), 6)
    return record


def metric_summary(evaluation: Evaluation, objective: Objective, num_clients: int,
                   metric: str | None = None) -> dict[str, Any]:
    """{mean, worst, per_client} of the primary metric (or `metric`, a secondary one);
    worst follows the metric's direction (the highest perplexity, the lowest accuracy)."""
    name = metric or objective.primary
    values = [evaluation[c][name] for c in sorted(evaluation)]
    return {"mean": round(float(np.mean(values)), 6),
            "worst": round(float(objective.worst(values, name)), 6),
            "per_client": [round(evaluation[c][name], 6) if c in evaluation
                           else None for c in range(num_clients)]}


def summarise_run(config: ExperimentConfig, algorithm: Algorithm, engine: Engine,
                  evaluation: Evaluation, objective: Objective, wall: float,
                  alternatives: dict[str, Evaluation] | None = None) -> dict[str, Any]:
    """summary.json; `alternatives` are the method's other evaluations of its clients
    (`Algorithm.alternative_evaluations`), reported by name beside the headline metric."""
    clusters = algorithm.clusters()
    labels = partition_labels(clusters, engine.num_clients)
    groups = engine.true_groups
    summary: dict[str, Any] = {
        "algorithm": config.algorithm.name,
        "dataset": config.data.dataset,
        **({"data_source": engine.data_source} if engine.data_source else {}),
        "scenario": config.data.scenario.kind,
        "seed": config.seed,
        "rounds": config.rounds,
        "num_clients": engine.num_clients,
        "engine": engine.name,
        "clusters": clusters,
        "num_clusters": algorithm.num_clusters(),
        "true_groups": None if groups is None else groups.tolist(),
        "ari": ari(groups, labels),
        "objective": objective.name,
        "primary_metric": objective.primary,
        objective.primary: metric_summary(evaluation, objective, engine.num_clients),
        **{m: metric_summary(evaluation, objective, engine.num_clients, m)
           for m in objective.secondary},
        "splits": [d.as_dict() for d in algorithm.decisions],
        "thresholds": algorithm.thresholds(),
        "tree": algorithm.tree(),
        "executor": engine.executor_name,
        "participation": {"per_round": config.participation.per_round(engine.num_clients)},
        "communication": dict(engine.communication),
        "wall_seconds": round(wall, 3),
        "rounds_per_second": round(config.rounds / wall, 4) if wall > 0 else None,
    }
    dp = dp_summary(config, algorithm, engine)
    if dp is not None:
        summary["dp"] = dp
    others = {name: {objective.primary: metric_summary(scores, objective, engine.num_clients)}
              for name, scores in (alternatives or {}).items() if scores}
    if others:
        summary["alternatives"] = others
    soft = algorithm.memberships()
    if soft is not None:
        summary["memberships"] = np.round(soft, 6).tolist()
    if engine.missing or engine.rejected:
        summary["missing_rounds"] = {str(c): r for c, r in sorted(engine.missing.items())}
        summary["rejected_replies"] = engine.rejected
    return summary


def dp_summary(config: ExperimentConfig, algorithm: Algorithm, engine: Engine
               ) -> dict[str, Any] | None:
    """The run's differential-privacy guarantee (ε for the whole run, max over clients, with δ)
    and how it was accounted; None without `privacy.dp`. Recomputed from the config and the
    example counts the clients declared, as the clients computed their noise."""
    dp = config.privacy.dp
    if dp is None:
        return None
    n = engine.num_clients
    sizes = [engine.declared[c] for c in range(n) if c in engine.declared]
    return accounting(dp, config.training, sizes, config.rounds,
                      releases_of(config.rounds, type(algorithm), algorithm.params),
                      config.participation.per_round(n), n)


def attack_summary(config: ExperimentConfig, algorithm: Algorithm, engine: Engine,
                   evaluation: Evaluation, objective: Objective, malicious: list[int]
                   ) -> dict[str, Any] | None:
    """Who attacked, what each cluster holds, and how the benign clients fare: the primary
    metric of their own models and, for label-flipping attacks, the attack success rate."""
    attack = config.attack
    if attack is None:
        return None
    p = objective.primary
    bad = set(malicious)
    benign = [c for c in sorted(evaluation) if c not in bad]
    clusters = []
    for k, members in enumerate(algorithm.clusters()):
        values = [evaluation[c][p] for c in members if c in evaluation]
        clusters.append({"cluster": k, "size": len(members),
                         "malicious": sum(c in bad for c in members),
                         p: round(float(np.mean(values)), 6) if values else None})
    # The cluster serving the most benign clients; judged with the ground truth, for
    # evaluation only (no algorithm needs it: each client uses its own cluster's model).
    benign_cluster = max(clusters, key=lambda c: (c["size"] - c["malicious"], -c["cluster"]))
    out: dict[str, Any] = {
        **attack.model_dump(mode="json", exclude={"label_map"}),
        "malicious": malicious,
        f"benign_{p}": round(float(np.mean([evaluation[c][p] for c in benign])), 6)
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
