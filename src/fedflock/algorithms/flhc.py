"""FL+HC: federated learning with hierarchical clustering of the clients' updates (Briggs, Fan,
Andras, "Federated learning with hierarchical clustering of local updates to improve training on
non-IID data", IJCNN 2020).

FedAvg for `warmup_rounds` rounds; in the next round every sampled client trains once from the
global model, the server clusters those updates agglomeratively (Euclidean or cosine distance,
ward, average, complete or single linkage) and each cluster runs FedAvg on its own from then on,
its first step the mean of its members' clustering-round updates. The clustering is a `cluster`
decision in `splits` with its rule's figures; its matrix (similarity 1 − distance / largest
distance) goes to splits/.

Where this departs from the paper, and why:
- Number of clusters. The paper cuts the dendrogram at a distance threshold it tunes per dataset
  (a distance between updates, whose scale depends on the model, the data, the learning rate and
  the round), so a number cannot be a default. `clusters: K` cuts it into K clusters when you
  know K; `threshold: T` is the paper's cut; without either (the default) the cut is the
  dendrogram's partition of lowest L = L1 + 2·L2 (`fedflock.clustering.hierarchical.
  sweep_partition`, FedDAG's sweep): L1, the mean distance inside clusters over the mean distance
  of all pairs; L2, the share of clients in clusters smaller than sqrt(n). Both terms are ratios,
  so no unit or scale enters; one cluster scores 1 and singletons 2, so a federation without
  groups stays whole unless a cut into clusters of at least sqrt(n) clients is tighter than the
  whole. The decision records the threshold chosen, the score and its terms.
- `warmup_rounds` defaults to 3: the paper clusters after a few rounds of FedAvg and varies
  how many; 3 is ours, not a number of the paper.
- Clients not sampled in the clustering round (partial participation) wait with the global model.
  The next time they are sampled they train it once, as the others did in the clustering round,
  and join the cluster whose clustering-round updates are nearest on average (the measure the
  clustering used); that update is not averaged into the cluster it joins (it was computed at
  the global model). A client new to a finished run is placed the same way by `fedflock assign`
  (the global model and the clusters' updates are kept in the checkpoint), without re-clustering
  anyone.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from fedflock.algorithms.base import AlgorithmParams, Cluster, Decision
from fedflock.algorithms.clustered import ClusteredAlgorithm
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.clustering.hierarchical import (
    distance_parts,
    linkage_parts,
    sweep_partition,
)
from fedflock.clustering.threshold import separation
from fedflock.similarity import update_distance
from fedflock.wire import Newcomer, Reply

Metric = Literal["euclidean", "cosine"]


class FLHCParams(AlgorithmParams):
    field_groups: ClassVar[dict[str, tuple[str, ...]]] = {
        "when": ("warmup_rounds",),
        "clustering": ("distance", "linkage", "clusters", "threshold"),
    }
    warmup_rounds: int = Field(3, ge=0, description="rounds of FedAvg before the clustering "
                               "round; more let the global model settle so that updates differ "
                               "by data, not by the starting point")
    distance: Metric = Field("euclidean", description="between two clients' updates: "
                             "euclidean (the paper) or cosine (1 - cosine similarity: "
                             "direction only, blind to how far a client moves)")
    linkage: Literal["ward", "average", "complete", "single"] = Field(
        "ward", description="how cluster distances are merged: ward (the paper: the merge "
        "that least increases the within-cluster variance; needs euclidean), average, "
        "complete or single")
    clusters: int | None = Field(None, ge=1, description="K: cut the dendrogram into K "
                                 "clusters when you know K")
    threshold: float | None = Field(None, gt=0, description="the paper's cut: merge while the "
                                    "linkage distance is below it (in the distance's units, "
                                    "which depend on model, data and lr: tune per setting)")

    @model_validator(mode="after")
    def _consistent(self) -> FLHCParams:
        if self.clusters is not None and self.threshold is not None:
            raise ValueError("give clusters or threshold, not both")
        if self.linkage == "ward" and self.distance != "euclidean":
            raise ValueError("linkage 'ward' needs distance 'euclidean'")
        return self


class UpdateRouter:
    """Places a client by its update at the global model of the clustering round: into the
    cluster whose members' clustering-round updates lie nearest on average."""

    def __init__(self, start: torch.Tensor, updates: torch.Tensor, cluster_ids: list[int],
                 metric: Metric) -> None:
        self.start = start
        self.updates = updates  # (n, d): the clustering round's updates, in cluster order
        self.cluster_ids = cluster_ids  # the cluster of each row
        self.metric = metric

    def vote(self, update: torch.Tensor) -> tuple[int, dict[str, Any]]:
        distance = update_distance(update.reshape(1, -1), self.updates, self.metric)[0]
        owner = np.asarray(self.cluster_ids)
        ids = sorted(set(self.cluster_ids))
        mean = {c: float(distance[owner == c].mean()) for c in ids}
        chosen = min(ids, key=lambda c: mean[c])
        return chosen, {"mean_distance": {str(c): round(v, 6) for c, v in mean.items()}}

    def route(self, client: Newcomer) -> tuple[int, dict[str, Any]]:
        """`fedflock assign`: the new client trains the clustering round's global model once."""
        return self.vote(client.update_at(self.start)[0])


@ALGORITHMS.register("flhc", "FL+HC (Briggs et al.): FedAvg, then one agglomerative "
                     "clustering of the clients' updates, then FedAvg per cluster")
class FLHC(ClusteredAlgorithm):
    name = "flhc"
    Params = FLHCParams
    state_fields = ("start", "clustered_updates", "update_cluster")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start: torch.Tensor | None = None  # the global model clients cluster from
        self.clustered_updates = torch.zeros(0)  # the clustering round's updates (n, d)
        self.update_cluster: list[int] = []  # the cluster of each of those rows

    @property
    def clustering_round(self) -> int:
        return self.params.warmup_rounds + 1

    def aggregate_train(self, rnd: int, replies: list[Reply]) -> dict[str, Any]:
        if rnd < self.clustering_round or self.start is not None or len(replies) < 2:
            return super().aggregate_train(rnd, replies)
        return self._cluster(rnd, sorted(replies, key=lambda r: r.client))

    def _cluster(self, rnd: int, replies: list[Reply]) -> dict[str, Any]:
        (root,) = self._clusters
        clients = [r.client for r in replies]
        updates = torch.stack([r.update[: self.update_size] for r in replies])
        distance = update_distance(updates, updates, self.params.distance)
        positions, figures = self._partition(distance)
        parts = [[clients[i] for i in part] for part in positions]
        self.start = root.params.clone()
        self._clusters = []
        for part in parts:
            cluster = self.new_cluster(part, root.params)
            self._apply(cluster, [r for r in replies if r.client in set(part)], replies)
            self._clusters.append(cluster)
        for client in sorted(set(range(self.num_clients)) - set(clients)):
            self.wait(client, -1, self.start)  # placed by its update when next sampled
        self._index_members()
        cluster_of = {c: cl.id for cl in self._clusters for c in cl.members}
        self.clustered_updates = updates.clone()
        self.update_cluster = [cluster_of[c] for c in clients]
        figures |= separation(distance, positions) | {"distance": self.params.distance,
                                                      "linkage": self.params.linkage}
        largest = float(distance.max()) or 1.0
        self.record(Decision("cluster", rnd, root.id, [c.id for c in self._clusters], parts,
                             figures, (clients, 1 - distance / largest)))
        return {"clusters": [{"id": c.id, "size": len(c.members), "replied": len(c.members)}
                             for c in self._clusters], "flhc_rule": figures}

    def _partition(self, distance: np.ndarray) -> tuple[list[list[int]], dict[str, Any]]:
        p = self.params
        if p.clusters is not None:
            return linkage_parts(distance, p.clusters, p.linkage), {"clusters": p.clusters}
        if p.threshold is not None:
            return distance_parts(distance, p.threshold, p.linkage), {"threshold": p.threshold}
        return sweep_partition(distance, method=p.linkage)

    # -- clients absent at the clustering, and newcomers ----------------------------------------
    def _router(self) -> UpdateRouter:
        assert self.start is not None
        return UpdateRouter(self.start, self.clustered_updates, self.update_cluster,
                            self.params.distance)

    def place(self, reply: Reply) -> tuple[Cluster | None, bool]:
        if self.start is None:
            return None, False
        cluster_id, _ = self._router().vote(reply.update[: self.update_size])
        return next(c for c in self._clusters if c.id == cluster_id), False

    @classmethod
    def newcomer_router(cls, state: dict[str, Any], params: Any) -> UpdateRouter | None:
        if state["start"] is None:  # the run ended before its clustering round
            return None
        return UpdateRouter(state["start"], state["clustered_updates"],
                            list(state["update_cluster"]), params.distance)

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"start": self.start,
                                       "clustered_updates": self.clustered_updates,
                                       "update_cluster": self.update_cluster}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.start = state["start"]
        self.clustered_updates = state["clustered_updates"]
        self.update_cluster = [int(c) for c in state["update_cluster"]]
