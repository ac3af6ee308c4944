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
from collections.abc import Iterable
from typing import Any

import torch
from pydantic import Field, model_validator

from fedflock.algorithms.base import Algorithm, AlgorithmContext, AlgorithmParams, Cluster, Decision
from fedflock.client.tasks import Train
from fedflock.clustering.split_stats import SplitInto, SplitStatistic
from fedflock.wire import Reply, Task


class SplitTestParams(AlgorithmParams):
    """What the windowed split test (`clustering.watch`) scores and how a cluster that fails it
    is split; shared by the methods that keep examining their clusters."""

    split_statistic: SplitStatistic = Field(
        "kway", description="split test: kway: pseudo-F of the best cut of the min-max merge "
        "tree into 2 to n/2 parts; bipartition: of its cut in two")
    split_into: SplitInto = Field(
        "cut", description="split test: cut: the parts of the cut the statistic scored; two: "
        "the min-max bipartition (CFL's paper)")
    f_threshold: float = Field(3.5, gt=1.0, description="split test: pseudo-F "
                               "(split_statistic) a split must exceed (CFL: split_rule auto; "
                               "incremental: recheck)")
    patience: int = Field(3, ge=1, description="split test: windows in a row above f_threshold "
                          "(see votes); also the rounds over which a model's change is judged "
                          "settled (stable_tol)")
    votes: int | None = Field(
        None, ge=1, description="split test: how many of the last `patience` windows must "
        "score above f_threshold, the latest among them (default: all of them)")
    stable_tol: float = Field(0.1, gt=0, lt=1, description="split test: a window may span "
                              "rounds once the cluster model's relative change shrank by less "
                              "than this (incremental: also when FedAvg has settled enough to "
                              "cluster)")
    window_coverage: float = Field(0.5, ge=0, le=1, description="split test: share of a "
                                   "cluster's members whose updates a window needs, besides "
                                   "CFL's min_replies (one round when that many reply)")
    same_round_share: float | None = Field(
        0.5, gt=0, le=1, description="split test: before a cluster's model has settled, one "
        "round's replies form a window when they number this share of what a window needs "
        "(they share one model, so they differ by data, not age); null: full windows only")
    round_window: int | None = Field(
        None, ge=2, description="split test: before a cluster's model has settled, one "
        "round's replies form a window when they number at least this many, whatever share of "
        "the members (null: by same_round_share only)")
    min_cluster_size: int = Field(3, ge=2, description="split test: smallest cluster examined")
    min_part_size: int = Field(
        1, ge=1, description="split test (split_into cut): fewest window members a part of "
        "a split holds; a smaller part joins the part of its most similar member, and one "
        "part left makes no split (1: the cut as scored; 2 on the grid lost CFL the "
        "7-group cell whose windows hold one member of some groups)")
    merge_test: bool = Field(False, description="probe mutually nearest clusters at one "
                             "model and merge the two when the split test finds no groups "
                             "there (algorithms.merging; off: on the grid it undid the one "
                             "IID split and gained no paying cell, a probe costs a second "
                             "training, and under attack a merge could admit attackers)")
    merge_min_probes: int = Field(12, ge=3, description="merge test: probes, and own updates, "
                                  "a window needs (6 merged feature_skew's invert group back on "
                                  "the grid, 12 did not)")

    reselect: bool = Field(False, description="once clusters have settled, a sampled member "
                           "scores their models on its training data (once per set of them) "
                           "and moves to one clearly more accurate, if its own serves its "
                           "other members clearly better and its update agrees with that "
                           "cluster's members' (algorithms.reselection; incremental: with "
                           "recheck, whose split test judges a cluster settled)")
    reselect_level: float = Field(0.001, gt=0, lt=0.5, description="reselect: level of "
                                  "Fisher's exact test by which another model is clearly "
                                  "more accurate than the member's own")

    @model_validator(mode="after")
    def _votes_within_patience(self) -> SplitTestParams:
        if self.votes is not None and self.votes > self.patience:
            raise ValueError(f"votes ({self.votes}) cannot exceed patience ({self.patience})")
        return self


class ClusteredAlgorithm(Algorithm):
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
                  diag: dict[str, Any]) -> list[list[int]] | None:
        """Return new member lists to split `cluster` (None keeps it). `diag` collects figures."""
        return None

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
            absent = set(cluster.members).difference(*map(set, parts))
            for client in sorted(absent):  # not in this round's replies: placed later
                self.wait(client, cluster.id, cluster.params)
            for members in parts:
                child = self.new_cluster(members, cluster.params)
                self._apply(child, [r for r in got if r.client in set(members)])
                next_clusters.append(child)
        self._clusters = next_clusters
        self._index_members()
        out: dict[str, Any] = {"clusters": log}
        if placed_before or self._unplaced:
            out["unplaced"] = len(self._unplaced)
        return out

    def combine(self, replies: list[Reply]) -> torch.Tensor:
        """The cluster's update from its members' replies (FedAvg: example-weighted mean)."""
        return weighted_mean(replies)

    def _apply(self, cluster: Cluster, replies: list[Reply]) -> torch.Tensor | None:
        """Add the combined update of the replies to the cluster model; return it."""
        if not replies:
            return None
        mean = self.combine(replies)
        cluster.params = self.step(cluster.params, mean, f"cluster {cluster.id}")
        return mean

    def model_of(self, client: int) -> torch.Tensor:
        if client in self._unplaced:
            return self._waiting[self._unplaced[client]]
        return self._cluster_of[client].params

    def tree(self) -> list[dict[str, Any]] | None:
        """The cluster tree of the recorded splits, for the summary and the report (CFL keeps
        its parameter tree instead; incremental clustering's Louvain communities and
        re-examination splits come out as one tree; a cluster a merge absorbed is a leaf
        with no members and `merged_into`). Unlike the parameter tree's, a node's members are
        where clients are now: a current cluster's members, and for a split one those of the
        current clusters below it (clients still waiting are in none)."""
        children: dict[int, list[int]] = {}
        split_round: dict[int, int] = {}
        absorbed = self.merged_into()
        for decision in self.decisions:
            if decision.kind == "split" and isinstance(decision.parent, int):
                children[decision.parent] = list(decision.children)
                split_round[decision.parent] = decision.round
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
                | ({"merged_into": absorbed[node]} if node in absorbed else {})
                for node in sorted(set(children) | set(parent_of))]

    def merged_into(self) -> dict[int, int]:
        """Each cluster a recorded merge absorbed -> the cluster that absorbed it."""
        return merged_into(self.decisions)

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
        self._unplaced = state.get("unplaced", {})
        self._waiting = state.get("waiting", {})
        self._waiting_count = Counter(self._unplaced.values())
        self._index_members()


def merged_into(decisions: Iterable[Decision]) -> dict[int, int]:
    """Each cluster a merge among `decisions` absorbed -> the cluster that absorbed it (the
    decisions are the record: `fedflock assign` reads them from a checkpoint)."""
    return {c: d.children[0] for d in decisions
            if d.kind == "merge" and isinstance(d.parent, list)
            for c in d.parent if c != d.children[0]}


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
