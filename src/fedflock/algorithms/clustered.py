"""Shared machinery of algorithms that keep one model per cluster of clients.

Per round: every sampled client trains from its cluster's model; a subclass may then re-partition
a cluster (`partition`); each (new) cluster adds the combination (`combine`: by default the
example-weighted mean) of its members' updates to its model.

Under partial participation a client can be *unplaced*: it belongs to no cluster yet (CFL: it was
absent when its cluster split; incremental clustering: it was never sampled before clustering). It
waits with a model (its `model_of`, used to evaluate it) until it is sampled again; then the
subclass asks it for a `placement_task` and `place`s it from the reply. Clients still unplaced
after the last round are placed by final tasks, so the final partition covers every client.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from fedflock.algorithms.base import Algorithm, AlgorithmContext, Cluster, Decision
from fedflock.client.tasks import Train
from fedflock.wire import Reply, Task


@dataclass
class Split:
    """How `partition` splits a cluster: the parts (member lists; a member in none waits and is
    placed later), the figures that decided it, the similarity matrix (client ids, values) it
    was decided on, kept in the run's splits/ folder, and the update rows of those ids (for a
    method that keeps them, as CFL's parameter tree). The base assigns the children's ids and
    records the decision."""

    parts: list[list[int]]
    figures: dict[str, Any] = field(default_factory=dict)
    matrix: tuple[list[int], Any] | None = None
    updates: torch.Tensor | None = None


class ClusteredAlgorithm(Algorithm):
    state_fields = ("clusters", "next_id", "unplaced", "waiting")

    def __init__(self, params: Any, context: AlgorithmContext) -> None:
        super().__init__(params, context)
        self._clusters: list[Cluster] = [
            Cluster(i, members, context.initial.clone())
            for i, members in enumerate(self.initial_clusters())
        ]
        self._next_id = len(self._clusters)
        self._unplaced: dict[int, int] = {}  # client -> key of the model it waits with
        self._waiting: dict[int, torch.Tensor] = {}  # key -> model
        self._waiting_count: Counter[int] = Counter()  # key -> clients waiting with it
        self._index_members()

    def initial_clusters(self) -> list[list[int]]:
        return [list(range(self.num_clients))]

    @classmethod
    def newcomer_clusters(cls, state: dict[str, Any]
                          ) -> list[tuple[int, torch.Tensor, list[int]]] | None:
        return [(c["id"], c["params"], list(c["members"])) for c in state["clusters"]]

    def train_task(self, rnd: int, client: int, params: torch.Tensor) -> Task:
        """What a member trains from its cluster's model (default: local SGD)."""
        return Train(client, rnd, params)

    def partition(self, rnd: int, cluster: Cluster, replies: list[Reply],
                  diag: dict[str, Any]) -> Split | None:
        """How to split `cluster` on this round's replies of its members (None keeps it whole);
        `diag` collects the round's figures."""
        return None

    def split(self, rnd: int, parent: Cluster, split: Split,
              start: torch.Tensor | None = None) -> list[Cluster]:
        """The one place a split is made: children with fresh ids starting from `start`
        (default: the parent's model), the members in no part waiting with the parent's model,
        and the decision recorded. The children replace the parent where the caller puts
        them."""
        absent = set(parent.members).difference(*map(set, split.parts))
        for client in sorted(absent):  # placed when next sampled
            self.wait(client, parent.id, parent.params)
        begin = parent.params if start is None else start
        children = [self.new_cluster(sorted(members), begin) for members in split.parts]
        self.record(Decision("split", rnd, parent.id, [c.id for c in children], split.parts,
                             split.figures, split.matrix))
        self.on_split(rnd, parent, children, split)
        return children

    def on_split(self, rnd: int, parent: Cluster, children: list[Cluster], split: Split
                 ) -> None:
        """After `parent` split into `children`: forget or record what the method keeps per
        cluster (CFL: the parameter tree)."""

    # -- unplaced clients (subclasses that create them override the two hooks) --------------
    def placement_task(self, rnd: int, client: int) -> Task:
        """What an unplaced client must do to be placed; default: train the waiting model."""
        return self.train_task(rnd, client, self._waiting[self._unplaced[client]])

    def place(self, reply: Reply) -> tuple[Cluster | None, bool]:
        """(cluster the client joins, or None to keep it waiting; whether its update was computed
        on that cluster's current model and can be aggregated)."""
        raise NotImplementedError(f"{self.name} does not place clients")

    def unplaced(self) -> list[int]:
        return sorted(self._unplaced)

    def num_clusters(self) -> int:
        return len(self._clusters)

    def wait(self, client: int, key: int, model: torch.Tensor) -> None:
        """Let `client` wait (or wait further) with the model kept under `key`."""
        previous = self._unplaced.get(client)
        self._unplaced[client] = key
        if key not in self._waiting:
            self._waiting[key] = model.clone()
        self._waiting_count[key] += 1
        if previous is not None:
            self._release(previous)

    def _release(self, key: int) -> None:
        self._waiting_count[key] -= 1
        if not self._waiting_count[key]:  # the last client waiting with this model left
            del self._waiting_count[key]
            self._waiting.pop(key, None)

    def _join(self, cluster: Cluster, client: int) -> None:
        cluster.members.append(client)
        self._cluster_of[client] = cluster
        self._release(self._unplaced.pop(client))

    def _place_replies(self, replies: list[Reply]) -> list[Reply]:
        """Place the replying unplaced clients; return the replies to aggregate this round."""
        keep = []
        for r in replies:
            if r.client not in self._unplaced:
                keep.append(r)
                continue
            cluster, usable = self.place(r)
            if cluster is not None:
                self._join(cluster, r.client)
                if usable:
                    keep.append(r)
        return keep

    def final_tasks(self, rnd: int, clients: list[int]) -> list[Task]:
        return [self.placement_task(rnd, c) for c in clients if c in self._unplaced]

    def finalize(self, replies: list[Reply]) -> None:
        self._place_replies(replies)

    def _index_members(self) -> None:
        self._cluster_of = {c: cl for cl in self._clusters for c in cl.members}

    def new_cluster(self, members: list[int], params: torch.Tensor) -> Cluster:
        cluster = Cluster(self._next_id, members, params.clone())
        self._next_id += 1
        return cluster

    def configure_train(self, rnd: int, clients: list[int]) -> list[Task]:
        return [self.placement_task(rnd, c) if c in self._unplaced
                else self.train_task(rnd, c, self._cluster_of[c].params) for c in clients]

    def aggregate_train(self, rnd: int, replies: list[Reply]) -> dict[str, Any]:
        placed_before = len(self._unplaced)
        replies = self._place_replies(replies)
        by_cluster: dict[int, list[Reply]] = {}
        for r in replies:
            by_cluster.setdefault(self._cluster_of[r.client].id, []).append(r)
        log: list[dict[str, Any]] = []
        next_clusters: list[Cluster] = []
        for cluster in self._clusters:
            got = by_cluster.get(cluster.id, [])
            diag: dict[str, Any] = {"id": cluster.id, "size": len(cluster.members),
                                    "replied": len(got)}
            split = self.partition(rnd, cluster, got, diag) if got else None
            log.append(diag)
            if split is None:
                mean = self._apply(cluster, got, replies)
                next_clusters.append(cluster)
                if mean is not None and "mean_norm" not in diag:
                    top = max(float(r.update[: self.update_size].norm()) for r in got)
                    diag["mean_norm"] = round(float(mean[: self.update_size].norm()), 6)
                    diag["max_norm"] = round(top, 6)
                continue
            for child in self.split(rnd, cluster, split):
                self._apply(child, [r for r in got if r.client in set(child.members)], replies)
                next_clusters.append(child)
        self._clusters = next_clusters
        self._index_members()
        out: dict[str, Any] = {"clusters": log}
        if placed_before or self._unplaced:
            out["unplaced"] = len(self._unplaced)
        return out

    def combine(self, cluster: Cluster, replies: list[Reply], everyone: list[Reply]
                ) -> torch.Tensor:
        """The cluster's update from its members' `replies` (FedAvg: example-weighted mean);
        `everyone` is the whole round's, for rules that borrow from other clusters."""
        return weighted_mean(replies)

    def _apply(self, cluster: Cluster, replies: list[Reply], everyone: list[Reply]
               ) -> torch.Tensor | None:
        """Add the combined update of the replies to the cluster model; return it."""
        if not replies:
            return None
        mean = self.combine(cluster, replies, everyone)
        cluster.params = self.step(cluster.params, mean, f"cluster {cluster.id}")
        return mean

    def model_of(self, client: int) -> torch.Tensor:
        if client in self._unplaced:
            return self._waiting[self._unplaced[client]]
        return self._cluster_of[client].params

    def split_children(self) -> dict[int, list[int]]:
        """Cluster id -> the ids of the clusters it split into, from the recorded splits."""
        return {d.parent: list(d.children) for d in self.decisions
                if d.kind == "split" and isinstance(d.parent, int)}

    def descendants(self, node: int) -> list[Cluster]:
        """The current clusters descending from cluster `node` (itself if it is current)."""
        below, heirs, todo = self.split_children(), set(), [node]
        while todo:
            item = todo.pop()
            if item in below:
                todo.extend(below[item])
            else:
                heirs.add(item)
        return [c for c in self._clusters if c.id in heirs]

    def tree(self) -> list[dict[str, Any]] | None:
        """The cluster tree of the recorded splits, for the summary and the report (CFL keeps
        its parameter tree instead). Unlike the parameter tree's, a node's
        members are where clients are now: a current cluster's members, and for a split one
        those of the current clusters below it (clients still waiting are in none)."""
        children = self.split_children()
        split_round = {d.parent: d.round for d in self.decisions
                       if d.kind == "split" and isinstance(d.parent, int)}
        if not children:
            return None
        parent_of = {child: parent for parent, below in children.items() for child in below}
        current = {c.id: sorted(c.members) for c in self._clusters}

        def members(node: int) -> list[int]:
            if node not in children:
                return current.get(node, [])
            return sorted(c for child in children[node] for c in members(child))

        return [{"id": node, "parent": parent_of.get(node), "members": members(node),
                 "split_round": split_round.get(node), "children": children.get(node, [])}
                for node in sorted(set(children) | set(parent_of))]

    def clusters(self) -> list[list[int]]:
        """The clusters, then one group per waiting model of the clients not placed yet."""
        waiting: dict[int, list[int]] = {}
        for client, key in sorted(self._unplaced.items()):
            waiting.setdefault(key, []).append(client)
        return [sorted(c.members) for c in self._clusters] + list(waiting.values())

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {
            "clusters": [vars(c).copy() for c in self._clusters],
            "next_id": self._next_id,
            "unplaced": self._unplaced,
            "waiting": self._waiting,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._clusters = [Cluster(**c) for c in state["clusters"]]
        self._next_id = state["next_id"]
        self._unplaced = state["unplaced"]
        self._waiting = state["waiting"]
        self._waiting_count = Counter(self._unplaced.values())
        self._index_members()


def weighted_mean(replies: list[Reply]) -> torch.Tensor:
    """Example-weighted mean of the replies' updates, accumulated row by row: every coordinate
    sees the same sequence of additions wherever it sits in the vector, so the result is exactly
    permutation-equivariant (a masked run aggregates bit for bit like a plain one; a fused
    reduction is not)."""
    total = float(sum(r.num_examples for r in replies))
    acc = torch.zeros_like(replies[0].update)
    for reply in replies:  # no examples at all: every reply counts the same
        acc.add_(reply.update, alpha=reply.num_examples / total if total > 0
                 else 1 / len(replies))
    return acc
