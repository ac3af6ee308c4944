"""Shared machinery of algorithms that keep one model per cluster of clients.

Per round: every sampled client trains from its cluster's model; a subclass may then re-partition
a cluster (`partition`); each (new) cluster adds the example-weighted mean of its members'
updates to its model.
"""

from __future__ import annotations

from typing import Any

import torch

from fedflock.algorithms.base import Algorithm, Cluster
from fedflock.client.protocol import TrainReply, TrainTask


class ClusteredAlgorithm(Algorithm):
    update_mode = "update"

    def __init__(self, params: Any, num_clients: int, initial: torch.Tensor,
                 update_size: int) -> None:
        super().__init__(params, num_clients, initial, update_size)
        self._clusters: list[Cluster] = [
            Cluster(i, members, initial.clone())
            for i, members in enumerate(self.initial_clusters())
        ]
        self._next_id = len(self._clusters)
        self._index_members()

    def initial_clusters(self) -> list[list[int]]:
        return [list(range(self.num_clients))]

    def partition(self, rnd: int, cluster: Cluster, replies: list[TrainReply],
                  diag: dict[str, Any]) -> list[list[int]] | None:
        """Return new member lists to split `cluster` (None keeps it). `diag` collects figures."""
        return None

    def _index_members(self) -> None:
        self._cluster_of = {c: cl for cl in self._clusters for c in cl.members}

    def new_cluster(self, members: list[int], params: torch.Tensor) -> Cluster:
        cluster = Cluster(self._next_id, members, params.clone())
        self._next_id += 1
        return cluster

    def configure_train(self, rnd: int, clients: list[int]) -> list[TrainTask]:
        return [TrainTask(c, self._cluster_of[c].params, rnd, self.update_mode) for c in clients]

    def aggregate_train(self, rnd: int, replies: list[TrainReply]) -> dict[str, Any]:
        by_cluster: dict[int, list[TrainReply]] = {}
        for r in replies:
            by_cluster.setdefault(self._cluster_of[r.client].id, []).append(r)
        log: list[dict[str, Any]] = []
        next_clusters: list[Cluster] = []
        for cluster in self._clusters:
            got = by_cluster.get(cluster.id, [])
            diag: dict[str, Any] = {"id": cluster.id, "size": len(cluster.members),
                                    "replied": len(got)}
            parts = self.partition(rnd, cluster, got, diag) if got else None
            log.append(diag)
            if parts is None:
                mean = self._apply(cluster, got)
                next_clusters.append(cluster)
                if mean is not None and "mean_norm" not in diag:
                    top = max(float(r.update[: self.update_size].norm()) for r in got)
                    diag["mean_norm"] = round(float(mean[: self.update_size].norm()), 6)
                    diag["max_norm"] = round(top, 6)
                continue
            for members in parts:
                child = self.new_cluster(members, cluster.params)
                self._apply(child, [r for r in got if r.client in set(members)])
                next_clusters.append(child)
        self._clusters = next_clusters
        self._index_members()
        return {"clusters": log}

    @staticmethod
    def _apply(cluster: Cluster, replies: list[TrainReply]) -> torch.Tensor | None:
        """Add the replies' weighted mean update to the cluster model; return that mean."""
        if not replies:
            return None
        mean = _weighted_mean([r.update for r in replies], replies)
        cluster.params = cluster.params + mean.to(cluster.params.dtype)
        return mean

    def model_of(self, client: int) -> torch.Tensor:
        return self._cluster_of[client].params

    def clusters(self) -> list[list[int]]:
        return [sorted(c.members) for c in self._clusters]

    def state_dict(self) -> dict[str, Any]:
        return {
            "clusters": [vars(c).copy() for c in self._clusters],
            "next_id": self._next_id,
            "splits": self.splits,
            "split_matrices": self.split_matrices,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._clusters = [Cluster(**c) for c in state["clusters"]]
        self._next_id = state["next_id"]
        self.splits = state["splits"]
        self.split_matrices = state["split_matrices"]
        self._index_members()


def _weighted_mean(updates: list[torch.Tensor], replies: list[TrainReply]) -> torch.Tensor:
    """Example-weighted mean, accumulated row by row: every coordinate sees the same sequence of
    additions wherever it sits in the vector, so the result is exactly permutation-equivariant
    (a masked run aggregates bit for bit like a plain one; a fused reduction is not)."""
    total = float(sum(r.num_examples for r in replies))
    acc = torch.zeros_like(updates[0])
    for row, reply in zip(updates, replies, strict=True):
        acc.add_(row, alpha=reply.num_examples / total)
    return acc
