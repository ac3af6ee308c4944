"""FedSoft: soft clustered federated learning with proximal local updating (Ruan and
Joe-Wong, AAAI 2022).

S cluster centres. Every `tau` rounds each sampled client estimates its importance weights
u_s, the share of its samples whose loss is lowest under centre s (`sigma` where that share is
zero). Each round it trains its own persistent personal model w on
f(w) + lambda/2 * sum_s u_s ||w - c_s||^2 and sends it; the server sets
every centre to the mean of the personal models it received, weighted by u_s * n (examples). A
client's cluster is the centre of its largest weight (what ARI scores); `memberships()` are
its normalised weights.

Evaluation: the headline scores each client on the centre of its largest weight, the cluster
model every clustered method is compared by; its personal model, which adds its own local
fine-tuning, is reported beside it (`alternatives.personal` in summary.json). A client never
sampled has no weights and no personal model yet: it is scored on centre 0 and belongs to no
cluster.

Where this departs from the paper and the authors' code, and why:
- Selection: by default the run's uniform sample; `selection: clusters` is the paper's
  per-cluster selection, each centre drawing its share of the round's clients with
  probabilities proportional to u_s * n over the clients whose weights it knows (uniform
  weights for the others). The paper has every client estimate its weights every tau rounds;
  here only the sampled clients do (the others keep their latest), so a round costs what a
  FedAvg round costs.
- The server keeps each client's personal model and weights and sends them back with the
  centres (the paper keeps them on the client). It sees both in every reply anyway; held by
  the server they are in the run's checkpoint, so a resumed run continues exactly, where state
  left on the clients would be lost (embedded clients restart empty, and a Flower node keeps
  its state for one run only). The price is one model more down per client and round.
- The first personal model is a copy of the centre of the client's largest weight (the
  authors keep a model per client from the start); the personal model is trained with the
  run's local SGD (the authors use Adam).
- The weights are not renormalised after sigma is applied, as in the authors' code; the
  proximal and aggregation weights are these u.
- The published server code does not run (it calls a client method with an argument it does
  not take): this is built from the paper.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from fedflock.algorithms.base import AlgorithmContext, AlgorithmParams
from fedflock.algorithms.mixture import SoftClustered
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.client.tasks import Evaluate, SoftTrain
from fedflock.wire import Reply, Task


class FedSoftParams(AlgorithmParams):
    field_groups: ClassVar[dict[str, tuple[str, ...]]] = {
        "clusters": ("clusters", "tau", "sigma"),
        "local training": ("mu",),
        "participation": ("selection",),
    }
    clusters: int = Field(2, ge=2, description="S, the number of cluster centres")
    tau: int = Field(2, ge=1, description="rounds between two estimates of a client's "
                     "importance weights (the paper: 2); a larger tau costs fewer loss "
                     "evaluations and follows shifting clients more slowly")
    sigma: float = Field(1e-4, gt=0, lt=1, description="the weight of a centre under which "
                         "none of a client's samples has its lowest loss (keeps every centre "
                         "in reach)")
    mu: float = Field(0.1, ge=0, description="lambda, the proximal pull of the personal model "
                      "towards the centres (the authors: 0.1 on MNIST, 0.01 on CIFAR-10); 0 "
                      "trains each personal model alone")
    selection: Literal["run", "clusters"] = Field(
        "run", description="run: the run's uniform sample; clusters: the paper's selection, "
        "each centre drawing its share of the round's clients by u * n")


@ALGORITHMS.register("fedsoft", "FedSoft (Ruan & Joe-Wong): S centres, personal models pulled "
                     "towards them by each client's importance weights")
class FedSoft(SoftClustered):
    """The centres are `models`, the importance weights `weights`."""

    name = "fedsoft"
    Params = FedSoftParams
    state_fields = ("personal",)

    def __init__(self, params: FedSoftParams, context: AlgorithmContext) -> None:
        super().__init__(params, context)
        self.personal: dict[int, torch.Tensor] = {}  # client -> its latest personal model

    def participants(self, rnd: int, sampled: list[int]) -> list[int]:
        """`selection: clusters`: each centre draws len(sampled) / S clients by u_s * n."""
        p = self.params
        if p.selection == "run":
            return sampled
        rng = np.random.default_rng([self.context.seed, 23, rnd])
        share = min(max(1, len(sampled) // self.k), self.num_clients)
        chosen: set[int] = set()
        for s in range(self.k):
            weight = self.weights[:, s].numpy()
            chosen.update(rng.choice(self.num_clients, size=share, replace=False,
                                     p=weight / weight.sum()).tolist())
        return sorted(chosen)

    def configure_train(self, rnd: int, clients: list[int]) -> list[Task]:
        p = self.params
        estimate = (rnd - 1) % p.tau == 0
        return [SoftTrain(c, rnd, self.stacked(), self.personal.get(c),
                          self.weights[c].to(self.stacked().dtype) if self.seen[c] else None,
                          mu=p.mu, sigma=p.sigma, estimate=estimate) for c in clients]

    def aggregate_train(self, rnd: int, replies: list[Reply]) -> dict[str, Any]:
        stack = self.stacked()
        for r in replies:
            self.weights[r.client] = r.tensors["importance"].double()
            self.seen[r.client] = True
            self.personal[r.client] = stack[r.choice] + r.update
        if replies:  # centre s = the personal models' mean weighted by u_s * n
            clients = [r.client for r in replies]
            examples = torch.tensor([float(r.num_examples) for r in replies],
                                    dtype=torch.float64)
            weight = self.weights[clients] * examples[:, None]  # (replies, S)
            total = weight.sum(0)
            means = (weight / total.clamp_min(1e-300)).T.to(stack.dtype) @ torch.stack(
                [self.personal[c] for c in clients])
            for s in torch.nonzero(total > 0).flatten().tolist():  # unweighed: keeps its model
                self.models[s] = self.step(self.models[s], means[s] - self.models[s],
                                           f"centre {s}")
        self._stack = None
        return {"choices": np.bincount([r.choice for r in replies],
                                       minlength=self.k).tolist()}

    def alternative_evaluations(self) -> dict[str, Any]:
        return {"personal": lambda client, rnd: Evaluate(
            client, rnd, self.personal.get(client, self.model_of(client)))}

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"personal": {c: w.clone() for c, w in
                                                    self.personal.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.personal = {int(c): w.clone() for c, w in state["personal"].items()}
