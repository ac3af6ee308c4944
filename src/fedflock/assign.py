"""Place new clients into a trained CFL run by traversing its parameter tree (Algorithm 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedflock.algorithms.base import Decision
from fedflock.algorithms.clustered import merged_into
from fedflock.client.runtime import ClientRuntime
from fedflock.client.tasks import Evaluate, Train
from fedflock.clustering import ParameterTree
from fedflock.config import load_raw
from fedflock.data.scenarios import build_federated_data
from fedflock.errors import FedflockError
from fedflock.rundir import RunDirectory
from fedflock.validation import validate


def assign_new_clients(run_dir: Path, clients: int, seed: int) -> dict[str, Any]:
    """Draw `clients` new clients of the run's scenario (same groups, fresh samples), route each
    through the tree and evaluate it on the model of the cluster it lands in."""
    run = RunDirectory(run_dir)
    if not run.config_path.is_file() or not run.checkpoint_path.is_file():
        raise FedflockError(f"{run_dir} is not a finished run (config.yaml and checkpoints/)")
    config = validate(load_raw(run.config_path))
    state = run.read_checkpoint(config.algorithm.name)["algorithm"]
    if "tree" not in state:
        raise FedflockError(f"{run_dir}: algorithm {config.algorithm.name!r} has no "
                            "parameter tree (assign works on cfl runs)")
    try:
        tree = ParameterTree.from_dict(state["tree"])
        leaf_models = {c["id"]: c["params"] for c in state["clusters"]}
        absorbed = merged_into(Decision.from_state(d) for d in state["decisions"])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise FedflockError(f"{run.checkpoint_path}: a damaged parameter tree "
                            f"({type(err).__name__}: {err})") from None
    trained = build_federated_data(config.data, config.seed)
    data_cfg = config.data.model_copy(update={"clients": clients})
    fresh = build_federated_data(data_cfg, seed, shift_seed=config.seed)
    runtime = ClientRuntime(fresh, config.model, config.training, config.seed, config.privacy)

    # Which true group each leaf serves (majority of its training clients), to score routing.
    leaf_group = {}
    for cluster in state["clusters"]:
        groups = trained.groups[cluster["members"]]
        leaf_group[cluster["id"]] = int(np.bincount(groups).argmax())

    rows = []
    for client in range(clients):
        def update_at(params: torch.Tensor, c: int = client) -> torch.Tensor:
            reply = Train(c, 0, params).run(runtime)
            return reply.update[: runtime.spec.num_trainable].reshape(1, -1)

        leaf, path = tree.route(update_at, absorbed)
        acc = Evaluate(client, 0, leaf_models[leaf]).run(runtime).metrics["accuracy"]
        rows.append({"client": client, "true_group": int(fresh.groups[client]), "cluster": leaf,
                     "cluster_group": leaf_group[leaf], "accuracy": round(acc, 4), "path": path})
    correct = [r["true_group"] == r["cluster_group"] for r in rows]
    return {"run": str(run_dir), "clients": rows,
            "routed_correctly": float(np.mean(correct)),
            "accuracy_mean": float(np.mean([r["accuracy"] for r in rows]))}
