"""Place new clients into a trained run: through the method's router where it has one (CFL's
parameter tree, Algorithm 4 of the paper: the row's `route` is the path taken; PACFL: the
client's data subspaces), or else into the cluster model that scores best on the client's
own training data, as that method places clients itself (incremental clustering's newcomers:
the most accurate; IFCA: its criterion, the lowest loss). A method whose clients fine-tune the
final model (fedavg_ft) has each new client fine-tune the model it joins before it is scored."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score

from fedflock.algorithms import ALGORITHMS, validate_params
from fedflock.algorithms.base import finite_sum
from fedflock.client.runtime import ClientRuntime
from fedflock.client.tasks import Evaluate, Select, Train
from fedflock.config import ExperimentConfig, load_raw
from fedflock.data.scenarios import build_federated_data
from fedflock.errors import FedflockError
from fedflock.rundir import RunDirectory
from fedflock.validation import validate
from fedflock.wire import Reply, Task

# (client, runtime) -> (the cluster it joins, how its router decided: None without one)
Placer = Callable[[int, ClientRuntime], tuple[int, Any]]


@dataclass
class _Joining:
    """A new client as a router questions it (`fedflock.wire.Newcomer`)."""

    id: int
    runtime: ClientRuntime

    def update_at(self, params: torch.Tensor) -> torch.Tensor:
        reply = Train(self.id, 0, params).run(self.runtime)
        return reply.update[: self.runtime.spec.num_trainable].reshape(1, -1)

    def run(self, task: Task) -> Reply:
        reply = task.run(self.runtime)
        task.check(reply)  # a router trusts a new client's reply no more than a member's
        return reply


def _router_placer(router: Any) -> Placer:
    def place(client: int, runtime: ClientRuntime) -> tuple[int, Any]:
        return router.route(_Joining(client, runtime))

    return place


def _score_placer(ids: list[int], models: torch.Tensor, criterion: str) -> Placer:
    def place(client: int, runtime: ClientRuntime) -> tuple[int, Any]:
        reply = Select(client, 0, models, criterion=criterion, train=False).run(runtime)
        return ids[reply.choice], None

    return place


def _placement(config: ExperimentConfig, state: dict[str, Any]
               ) -> tuple[Placer, dict[int, torch.Tensor], dict[int, list[int]]]:
    """How a new client is placed, the models it may join and their members."""
    name = config.algorithm.name
    cls = ALGORITHMS.get(name)
    clusters = cls.newcomer_clusters(state)
    if clusters is None:
        raise FedflockError(f"algorithm {name!r} keeps no shared model a new client could join")
    models = {cid: params for cid, params, _ in clusters}
    members = {cid: group for cid, _, group in clusters}
    params = validate_params(config.algorithm)
    router = cls.newcomer_router(state, params)
    if router is not None:
        return _router_placer(router), models, members
    ids = list(models)
    criterion = cls.newcomer_criterion(params)
    return _score_placer(ids, torch.stack([models[i] for i in ids]), criterion), models, members


def _model_for(client: int, model: torch.Tensor, epochs: int | None,
               runtime: ClientRuntime) -> torch.Tensor:
    """The joined model, fine-tuned on the client's own data first where the method's own
    clients end that way."""
    if not epochs:
        return model
    tuned = finite_sum(model, Train(client, 0, model, epochs=epochs).run(runtime).update)
    return model if tuned is None else tuned  # a diverged fine-tuning is dropped, as in the run


NEWCOMER_SEED = 1000  # the new clients' samples: a stream apart from the run's own seeds


def assign_new_clients(run_dir: Path, clients: int, seed: int | None = None
                       ) -> dict[str, Any]:
    """Draw `clients` new clients of the run's scenario (same groups, fresh samples from
    `seed`, by default NEWCOMER_SEED), place each and evaluate it on the model of the cluster
    it joins."""
    seed = NEWCOMER_SEED if seed is None else seed
    run = RunDirectory(run_dir)
    if not run.config_path.is_file() or not run.checkpoint_path.is_file() or \
            not (run.path / "summary.json").is_file():
        raise FedflockError(f"{run_dir} is not a finished run (config.yaml, checkpoints/ and "
                            "summary.json)")
    config = validate(load_raw(run.config_path))
    state = run.read_checkpoint(config.algorithm.name)["algorithm"]
    try:
        place, models, members = _placement(config, state)
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as err:
        raise FedflockError(f"{run.checkpoint_path}: damaged clusters or parameter tree "
                            f"({type(err).__name__}: {err})") from None
    trained = build_federated_data(config.data, config.seed)
    data_cfg = config.data.model_copy(update={"clients": clients})
    fresh = build_federated_data(data_cfg, seed, shift_seed=config.seed,
                                 tokenizer=run.read_tokenizer())
    runtime = ClientRuntime(fresh, config.model, config.training, config.seed, config.privacy)
    metric = runtime.objective.primary
    epochs = ALGORITHMS.get(config.algorithm.name).newcomer_finetune(
        validate_params(config.algorithm))

    # Which true group each cluster serves (majority of its training clients), to score the
    # placement; a cluster without members serves none.
    serves = {cid: int(np.bincount(trained.groups[group]).argmax()) if group else None
              for cid, group in members.items()}
    rows = []
    for client in range(clients):
        cluster, route = place(client, runtime)
        model = _model_for(client, models[cluster], epochs, runtime)
        score = Evaluate(client, 0, model).run(runtime).metrics[metric]
        row = {"client": client, "true_group": int(fresh.groups[client]), "cluster": cluster,
               "cluster_group": serves[cluster], metric: round(score, 4)}
        rows.append(row | ({"route": route} if route is not None else {}))
    correct = [r["true_group"] == r["cluster_group"] for r in rows]
    # how well the new clients are grouped among themselves, whatever the clusters serve
    grouped = adjusted_rand_score([r["true_group"] for r in rows], [r["cluster"] for r in rows])
    return {"run": str(run_dir), "algorithm": config.algorithm.name, "metric": metric,
            "finetune_epochs": epochs or 0, "clients": rows,
            "routed_correctly": float(np.mean(correct)), "ari": round(float(grouped), 6),
            f"{metric}_mean": float(np.mean([r[metric] for r in rows]))}
