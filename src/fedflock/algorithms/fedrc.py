"""FedRC: robust clustering that separates concept shift from label skew (Guo, Tang, Lin,
"FedRC: Tackling diverse distribution shifts challenge in federated learning by robust
clustering", ICML 2024).

A mixture of K shared models fitted as FedEM's, with one change to the E-step: a sample's
responsibility divides each model's likelihood by that model's label marginal,
gamma_ik proportional to pi_k * p_k(y_i | x_i) / P_k(y_i). A model that has seen many samples of
class y is not preferred for a sample of class y merely because y is frequent in its cluster:
clients that hold different classes of the same concept (label skew) land together, and only
a different p(y | x) (concept shift) separates them. Each client sends the per-class mass of
its responsibilities (K x C floats); the server keeps every client's latest and sets
P_k(y) = its share of class y, uniform until the first replies. Models are trained on the
gamma-weighted loss and averaged by examples (`fedflock.algorithms.mixture`).

Prediction: the pi-weighted ensemble of the K models (the headline, as the memberships are
soft) and the model of the largest weight (`alternatives.hard` in summary.json).

Where this departs from the paper and why:
- The responsibilities use P_k(y) as estimated from the previous round's masses (the paper
  alternates the same way; the class masses of clients not sampled are their latest).
- Only classification has a label marginal: other objectives are refused in one line.
- The per-class masses are statistics of the clients' labels that no privacy mechanism noises
  (as the mixture weights; see the privacy page).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel

from fedflock.algorithms.base import AlgorithmContext
from fedflock.algorithms.mixture import MixtureAlgorithm
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.client.tasks import MixtureTrain
from fedflock.errors import ConfigError
from fedflock.wire import Reply, Task


@ALGORITHMS.register("fedrc", "FedRC (Guo et al.): a mixture of K models whose E-step divides "
                     "by each model's label marginal, so label skew stays together")
class FedRC(MixtureAlgorithm):
    name = "fedrc"
    state_fields = ("class_mass",)

    def __init__(self, params: BaseModel, context: AlgorithmContext) -> None:
        spec = context.data_spec  # refused before any model is made
        if spec is not None and spec.objective != "classification":
            raise ConfigError(f"config: algorithm 'fedrc' divides by each model's label "
                              f"marginal, which objective {spec.objective!r} of dataset "
                              f"{context.dataset!r} does not have")
        super().__init__(params, context)
        classes = spec.num_classes if spec is not None else 1
        self.class_mass = torch.zeros(self.num_clients, self.k, classes, dtype=torch.float64)

    def label_marginals(self) -> torch.Tensor:
        """P_k(y) (K, C): each model's share of the responsibility mass of every class, over
        every client's latest; uniform for a model with no mass yet."""
        total = self.class_mass.sum(0)
        mass = total.sum(1, keepdim=True)
        uniform = torch.full_like(total, 1.0 / total.shape[1])
        return torch.where(mass > 0, total / mass.clamp_min(1e-300), uniform)

    def configure_train(self, rnd: int, clients: list[int]) -> list[Task]:
        """Every task of the round carries the same marginals (one tensor, built once)."""
        marginals = self.label_marginals().to(self.stacked().dtype)
        return [MixtureTrain(c, rnd, self.stacked(), self.prior(c), label_marginals=marginals)
                for c in clients]

    def absorb(self, reply: Reply) -> None:
        super().absorb(reply)
        self.class_mass[reply.client] = reply.tensors["class_mass"].double()

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"class_mass": self.class_mass.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.class_mass = state["class_mass"].clone()
