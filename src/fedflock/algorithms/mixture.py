"""What the soft-membership methods share: K shared models and every client's weight of each
(`SoftClustered`: FedEM, FedRC, FedSoft), and the mixture round of FedEM and FedRC.

Each round a sampled client runs one `MixtureTrain` task: it weighs its samples among the K
models (E-step), updates its mixture weights pi and trains every model on its weighted loss
(M-step); the server averages each model's updates over the clients, weighted by examples, and
keeps each client's latest pi, which it sends back with the models next time. A client predicts
with the pi-weighted mixture of the models' outputs (`EvaluateMixture`); its hard cluster, what
ARI scores, is its largest weight, and the model of that cluster is reported beside the mixture
(summary's `alternatives.hard`). A client never sampled has uniform weights and no cluster yet.

Every model is trained by every sampled client each round: a client releases K updates per
round (counted by the differential-privacy accounting) and the norm bound checks each. The
mixture weights (K floats) travel up with the updates so that the server can report the
memberships and evaluate the clients; like the selection scores of IFCA, no privacy
mechanism noises them.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, Field

from fedflock.algorithms.base import Algorithm, AlgorithmContext, AlgorithmParams
from fedflock.algorithms.clustered import weighted_mean
from fedflock.client.tasks import Evaluate, EvaluateMixture, MixtureTrain
from fedflock.wire import Reply, Task


class MixtureParams(AlgorithmParams):
    field_groups: ClassVar[dict[str, tuple[str, ...]]] = {"mixture": ("clusters",)}
    clusters: int = Field(3, ge=2, description="K, the number of shared models each client "
                          "mixes (the papers' default 3); set it to the number of distributions "
                          "you expect")


class SoftClustered(Algorithm):
    """K models (from K distinct seeded initialisations) and a weight of every model for every
    client (rows sum to 1 when normalised): the hard cluster of a client is its largest weight,
    `memberships()` the normalised rows. A client no reply has come from yet has uniform
    weights and no cluster (FedEM, FedRC, FedSoft)."""

    state_fields = ("models", "weights", "seen")

    def __init__(self, params: BaseModel, context: AlgorithmContext) -> None:
        super().__init__(params, context)
        k = self.k
        self.models = list(context.initial_models(k).clone())
        self.weights = torch.full((self.num_clients, k), 1.0 / k, dtype=torch.float64)
        self.seen = torch.zeros(self.num_clients, dtype=torch.bool)
        self._stack: torch.Tensor | None = None

    @property
    def k(self) -> int:
        return self.params.clusters  # type: ignore[attr-defined]

    def stacked(self) -> torch.Tensor:
        """The (K, P) stack every task of a round shares (built once per round)."""
        if self._stack is None:
            self._stack = torch.stack(self.models)
        return self._stack

    def choice(self, client: int) -> int:
        """The client's hard cluster: its largest weight (0 before any reply)."""
        return int(self.weights[client].argmax())

    def model_of(self, client: int) -> torch.Tensor:
        """The model of the client's largest weight (its hard cluster)."""
        return self.models[self.choice(client)]

    def memberships(self) -> np.ndarray:
        weights = self.weights.numpy()
        return weights / weights.sum(1, keepdims=True)

    def unplaced(self) -> list[int]:
        return torch.nonzero(~self.seen).flatten().tolist()

    def hard_clusters(self) -> torch.Tensor:
        """Every client's largest weight, -1 for a client never heard from."""
        return torch.where(self.seen, self.weights.argmax(1), -1)

    def clusters(self) -> list[list[int]]:
        """Clients by their largest weight; those never heard from form one group."""
        hard = self.hard_clusters()
        return [torch.nonzero(hard == k).flatten().tolist() for k in hard.unique().tolist()]

    def num_clusters(self) -> int:
        return len(self.hard_clusters()[self.seen].unique())

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"models": torch.stack(self.models),
                                       "weights": self.weights.clone(),
                                       "seen": self.seen.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.models = list(state["models"].clone())
        self.weights = state["weights"].clone()
        self.seen = state["seen"].clone()
        self._stack = None


class MixtureAlgorithm(SoftClustered):
    """Every sampled client runs one `MixtureTrain` round; each model is averaged by examples;
    clients predict with their mixture."""

    Params = MixtureParams
    state_fields = ()

    @classmethod
    def releases(cls, params: BaseModel, rounds: int) -> int:
        """K updates per round (one per model), plus the final releases."""
        return rounds * params.clusters + cls.final_releases  # type: ignore[attr-defined]

    def prior(self, client: int) -> torch.Tensor | None:
        """The client's mixture weights from its last round (None before its first)."""
        return self.weights[client].to(self.stacked().dtype) if self.seen[client] else None

    def configure_train(self, rnd: int, clients: list[int]) -> list[Task]:
        return [MixtureTrain(c, rnd, self.stacked(), self.prior(c)) for c in clients]

    def aggregate_train(self, rnd: int, replies: list[Reply]) -> dict[str, Any]:
        for reply in replies:
            self.absorb(reply)
        for k in range(self.k):
            rows = [r.with_tensors(update=r.tensors["updates"][k]) for r in replies]
            if rows:
                self.models[k] = self.step(self.models[k], weighted_mean(rows), f"model {k}")
        self._stack = None
        hard = [self.choice(r.client) for r in replies]
        return {"choices": np.bincount(hard, minlength=self.k).tolist()}

    def absorb(self, reply: Reply) -> None:
        """Keep what a client's reply says about it (its mixture weights)."""
        weights = reply.tensors["weights"].double().clamp_min(0)
        self.weights[reply.client] = weights / weights.sum()
        self.seen[reply.client] = True

    def evaluation_task(self, client: int, rnd: int) -> Task:
        return EvaluateMixture(client, rnd, self.stacked(),
                               self.weights[client].to(self.stacked().dtype))

    def alternative_evaluations(self) -> dict[str, Any]:
        return {"hard": lambda client, rnd: Evaluate(client, rnd, self.model_of(client))}
