"""PACFL: principal angles of the clients' data subspaces, one clustering before training
(Vahidian et al., "Efficient distribution similarity identification in clustered federated
learning via principal angles between client data subspaces", AAAI 2023).

In round 1 every client, sampled or not, sends once the first `rank` (p) left singular vectors
of its data matrix per class (the `basis` task: a signature of its inputs that reveals no
sample) and trains nothing. The server measures each pair's distance, the angle between the
subspaces of each class both hold, averaged over those classes
(`fedflock.similarity.subspaces`), clusters the clients once, and from round 2 runs FedAvg
inside each cluster on the run's sampled clients. Every clustering is a `cluster` decision in
`splits` with its rule's figures, and the matrix (similarity 1 − angle / 90°) goes to splits/.

Where this departs from the paper and the authors' code, and why:
- Per class, as the authors' code (the paper's text sends one basis of all the data): a class
  is compared with the same class, so clients whose labels mean different things (label
  permutation) are apart even when their pooled inputs look alike. A class held by one client
  only is left out of the pair's mean; two clients sharing no class are 90° apart.
- The angle is the smallest principal angle, arccos of the largest singular value of U_iᵀU_j
  (the paper). The authors compute the smallest element-wise arccos of U_iᵀU_j, the angle
  between the closest pair of basis vectors: `angle: elementwise` (taken on |U_iᵀU_j|, since a
  singular vector's sign is arbitrary).
- Number of clusters: the authors merge clusters while their distance is below β degrees, and
  β differs per dataset (3.5-42 across their scripts), so it cannot be a default. `clusters: K`
  cuts the average-linkage dendrogram into K clusters; without it (the default) every client
  is joined to its k = round(ln n) nearest others and the clusters are the connected
  components (`fedflock.clustering.threshold.neighbour_partition`, DistFL's rule): ranks only,
  no unit or scale to tune, and a federation without groups stays whole because the k-NN graph
  of one cloud is connected once k grows like log n. The price: a cluster needs more than k
  members. The decision records k, the median distance to the k-th nearest client, and the
  largest angle inside a cluster and smallest between clusters.
- Clients that miss the clustering round wait with the initial model; the next time they are
  sampled they send their bases and join the cluster holding most of their k nearest
  clustered clients. A client new to a trained run is placed the same way by `fedflock
  assign` (the bases of the clustered clients are kept in the checkpoint), without
  re-clustering or retraining anyone (the authors' "unseen clients" were part of the first
  clustering).
- The bases are data signatures, not model updates: differential privacy does not cover them
  (see the privacy page). Inputs that are token ids have no per-class subspace: refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import Field

from fedflock.algorithms.base import AlgorithmParams, Cluster, Decision
from fedflock.algorithms.clustered import ClusteredAlgorithm
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.client.tasks import Basis
from fedflock.clustering.hierarchical import linkage_parts
from fedflock.clustering.threshold import (
    default_neighbours,
    neighbour_partition,
    separation,
)
from fedflock.errors import ConfigError
from fedflock.similarity.subspaces import Angle, subspace_distance
from fedflock.wire import Newcomer, Reply, Task


class PACFLParams(AlgorithmParams):
    field_groups: ClassVar[dict[str, tuple[str, ...]]] = {
        "data subspaces": ("rank", "angle"),
        "number of clusters": ("clusters", "neighbours"),
    }
    rank: int = Field(3, ge=1, description="p: left singular vectors each client sends per "
                      "class (the paper: 3-5); more describe a class better and cost d floats "
                      "each")
    angle: Angle = Field("principal", description="principal: the smallest principal angle "
                         "between two subspaces (the paper); elementwise: the smallest angle "
                         "between two basis vectors (the authors' code)")
    clusters: int | None = Field(None, ge=1, description="K: cut the average-linkage "
                                 "dendrogram into K clusters when you know K; null: the "
                                 "scale-free k-nearest-neighbour rule")
    neighbours: int | None = Field(None, ge=1, description="k of the automatic rule (each "
                                   "client joined to its k nearest); null: round(ln n), at "
                                   "least 2")


@dataclass
class SubspaceRouter:
    """Places a client by its bases: the cluster holding most of its k nearest clustered
    clients (ties: the one of the nearest), as clients absent at the clustering are placed."""

    bases: torch.Tensor  # (n, C, d, p) of the clustered clients
    counts: torch.Tensor  # (n, C)
    clients: list[int]
    cluster_of: dict[int, int]  # client -> cluster id
    params: Any  # the method's: `angle` and `neighbours`
    distance: Callable[..., torch.Tensor] = subspace_distance  # the method's data distance

    def vote(self, bases: torch.Tensor, counts: torch.Tensor) -> tuple[int, dict[str, Any]]:
        distance = self.distance(bases[None], counts[None], self.bases, self.counts,
                                 self.params.angle)[0].numpy()
        k = min(self.params.neighbours or default_neighbours(len(self.clients)),
                len(self.clients))
        order = np.argsort(distance, kind="stable")[:k]
        nearest = [self.clients[i] for i in order]
        votes = Counter(self.cluster_of[c] for c in nearest)
        top = max(votes.values())
        cluster = next(self.cluster_of[c] for c in nearest if votes[self.cluster_of[c]] == top)
        return cluster, {"nearest": nearest,
                         "angles": [round(float(distance[i]), 3) for i in order]}

    def route(self, client: Newcomer) -> tuple[int, dict[str, Any]]:
        """`fedflock assign`: the new client sends its bases once."""
        _, classes, dim, rank = self.bases.shape
        reply = client.run(Basis(client.id, 0, rank=rank, classes=classes, dim=dim))
        return self.vote(reply.tensors["basis"], reply.tensors["counts"])


@ALGORITHMS.register("pacfl", "PACFL (Vahidian et al.): one clustering before training by the "
                     "principal angles between the clients' per-class data subspaces")
class PACFL(ClusteredAlgorithm):
    name = "pacfl"
    Params = PACFLParams
    state_fields = ("bases", "counts", "based", "clustered")
    data_distance = staticmethod(subspace_distance)  # how two clients' bases compare

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        spec, dataset = self.context.data_spec, self.context.dataset
        if spec is not None and (spec.integer_inputs or spec.objective != "classification"):
            raise ConfigError(f"config: algorithm {self.name!r} compares per-class subspaces "
                              f"of the inputs, which dataset {dataset!r} (token sequences, "
                              f"objective {spec.objective}) does not have")
        self.bases: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # client -> basis, counts
        self.clustered = False

    # -- the clustering round -----------------------------------------------------------------
    def participants(self, rnd: int, sampled: list[int]) -> list[int]:
        return sampled if self.clustered else list(range(self.num_clients))

    def _basis_task(self, rnd: int, client: int) -> Task:
        spec = self.context.data_spec
        shape = dict(classes=spec.num_classes, dim=int(np.prod(spec.input_shape))) if spec else {}
        return Basis(client, rnd, rank=self.params.rank, **shape)

    def wants_bases(self) -> bool:
        """Whether this round asks for bases instead of training (PACFL: until it clusters)."""
        return not self.clustered

    def configure_train(self, rnd: int, clients: list[int]) -> list[Task]:
        if self.wants_bases():
            return [self._basis_task(rnd, c) for c in clients]
        return super().configure_train(rnd, clients)

    def placement_task(self, rnd: int, client: int) -> Task:
        return self._basis_task(rnd, client)

    def aggregate_train(self, rnd: int, replies: list[Reply]) -> dict[str, Any]:
        if self.clustered:
            return super().aggregate_train(rnd, replies)
        clients = self.collect_bases(replies)
        bases, counts = self._stacked(clients)
        distance = subspace_distance(bases, counts, bases, counts, self.params.angle).numpy()
        return self.cluster(rnd, clients, distance, 1 - distance / 90.0,
                            {"angle": self.params.angle}, self.context.initial)

    def collect_bases(self, replies: list[Reply]) -> list[int]:
        """Keep the replies' bases and class counts; the clients that sent them, sorted."""
        self.bases = {r.client: (r.tensors["basis"].float(), r.tensors["counts"].float())
                      for r in replies}
        return sorted(self.bases)

    def cluster(self, rnd: int, clients: list[int], distance: np.ndarray,
                similarity: np.ndarray, figures: dict[str, Any], start: torch.Tensor
                ) -> dict[str, Any]:
        """Partition `clients` on `distance` (rows in their order), every cluster starting from
        `start`; the clients left out wait with it and are placed by their bases when next
        sampled. Recorded as one `cluster` decision with `similarity` as its matrix."""
        positions, rule = self._partition(distance)
        parts = [[clients[i] for i in part] for part in positions]
        previous = [c.id for c in self._clusters]
        self._clusters = [self.new_cluster(part, start) for part in parts]
        for client in sorted(set(range(self.num_clients)) - set(clients)):
            self.wait(client, -1, start)
        self._index_members()
        self.clustered = True
        figures = rule | separation(distance, positions) | figures
        self.record(Decision("cluster", rnd, previous, [c.id for c in self._clusters], parts,
                             figures, (clients, similarity)))
        return {"clusters": [{"id": c.id, "size": len(c.members), "replied": 0}
                             for c in self._clusters], f"{self.name}_rule": figures}

    def _partition(self, distance: np.ndarray) -> tuple[list[list[int]], dict[str, Any]]:
        if self.params.clusters is not None:
            return (linkage_parts(distance, self.params.clusters),
                    {"clusters": self.params.clusters, "linkage": "average"})
        return neighbour_partition(distance, self.params.neighbours)

    def _stacked(self, clients: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.stack([self.bases[c][0] for c in clients]),
                torch.stack([self.bases[c][1] for c in clients]))

    # -- clients absent at the clustering, and newcomers ----------------------------------------
    def _router(self) -> SubspaceRouter:
        clients = sorted(c for c in self.bases if c in self._cluster_of)
        bases, counts = self._stacked(clients)
        return SubspaceRouter(bases, counts, clients,
                              {c: self._cluster_of[c].id for c in clients}, self.params,
                              self.data_distance)

    def place(self, reply: Reply) -> tuple[Cluster | None, bool]:
        if not self.clustered:
            return None, False
        cluster_id, _ = self._router().vote(reply.tensors["basis"].float(),
                                            reply.tensors["counts"].float())
        return next(c for c in self._clusters if c.id == cluster_id), False

    @classmethod
    def newcomer_router(cls, state: dict[str, Any], params: Any) -> SubspaceRouter:
        cluster_of = {int(m): int(c["id"]) for c in state["clusters"] for m in c["members"]}
        rows = [i for i, c in enumerate(state["based"]) if int(c) in cluster_of]
        return SubspaceRouter(state["bases"][rows], state["counts"][rows],
                              [int(state["based"][i]) for i in rows], cluster_of, params,
                              cls.data_distance)

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        clients = sorted(self.bases)
        bases, counts = self._stacked(clients) if clients else (torch.zeros(0), torch.zeros(0))
        return super().state_dict() | {"bases": bases, "counts": counts, "based": clients,
                                       "clustered": self.clustered}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.clustered = bool(state["clustered"])
        self.bases = {int(c): (state["bases"][i], state["counts"][i])
                      for i, c in enumerate(state["based"])}
