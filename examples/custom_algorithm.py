"""A complete new method in one file, outside fedflock: FedProx (Li et al., MLSys 2020).

Each client minimises its loss plus mu/2 * ||w - w_global||^2 (the proximal term of the `train`
task, centred on the model it received); the server averages updates per cluster as FedAvg.
A second, optional piece shows a task of one's own: `update_norm` asks clients for the norm of
the update they would send, without sending it.

    fedflock --plugin examples/custom_algorithm.py list --params example_fedprox
    fedflock --plugin examples/custom_algorithm.py run configs/demo.yaml \\
        --set algorithm.name=example_fedprox --set algorithm.mu=0.01

or from Python: `fedflock.api.run(config, plugins=["examples/custom_algorithm.py"])`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field

from fedflock.algorithms import AlgorithmParams
from fedflock.algorithms.clustered import ClusteredAlgorithm
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.client.runtime import ClientRuntime
from fedflock.client.tasks import Train
from fedflock.wire import Reply, Task, check_metrics, register_task


class FedProxParams(AlgorithmParams):
    mu: float = Field(0.01, ge=0, description="weight of the proximal term (the paper: 0.001-1)")


@ALGORITHMS.register("example_fedprox", "FedProx: FedAvg with a proximal term (example)")
class FedProx(ClusteredAlgorithm):
    """One global model; local training pulled towards it by mu/2 * ||w - w_global||^2."""

    name = "example_fedprox"
    Params = FedProxParams

    def train_task(self, rnd: int, client: int, params: torch.Tensor) -> Task:
        return Train(client, rnd, params, proximal_mu=self.params.mu or None)


@register_task
@dataclass
class UpdateNorm(Task):
    """The norm of the update a client would send from `params` (nothing else leaves it)."""

    kind = "update_norm"
    params: torch.Tensor

    def run(self, runtime: ClientRuntime) -> Reply:
        reply = Train(self.client, self.round, self.params).run(runtime)
        return Reply(self.client, {}, {"norm": float(reply.update.norm())}, reply.num_examples)

    def check(self, reply: Reply) -> None:
        check_metrics(reply, ["norm"])
        super().check(reply)
