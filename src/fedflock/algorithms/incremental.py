"""Federated learning with incremental clustering (FL + Louvain), for partial participation.

FedAvg first, while the server keeps the latest update of every client it samples and fills
their similarity matrix (no communication beyond FedAvg's). When the trigger fires
(`cluster_when`), Louvain's communities of that graph become clusters, each trained by FedAvg;
a client never sampled before is placed the first time it is sampled afterwards, into the
cluster model that scores best on its own training data. With `recheck` every cluster keeps
being examined by CFL's windowed split test and splits when its members' updates hold groups.
Malicious clients share no positive edge with benign ones and so form clusters of their own
(a defence against model poisoning).

Departures from the paper, with their reasons and measurements: docs/methods/incremental.md
(the trigger, nested communities kept apart by same-round evidence, the re-examination).
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator

from fedflock.algorithms.base import Cluster
from fedflock.algorithms.clustered import ClusteredAlgorithm, Split
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.algorithms.windowed_split import SplitTestParams
from fedflock.client.tasks import Select
from fedflock.clustering.communities import SELF_TUNING_NEIGHBOUR
from fedflock.clustering.split_stats import SCORE_FIGURE
from fedflock.clustering.stability import Stabilisation
from fedflock.clustering.stored_updates import (
    ClusteringTrigger,
    GroupEvidence,
    cluster_store,
    update_store,
)
from fedflock.clustering.watch import Examination, SplitWatches
from fedflock.similarity.incremental import SKETCHABLE, IncrementalSimilarity
from fedflock.wire import Reply, Task


class IncrementalParams(SplitTestParams):
    field_groups: ClassVar[dict[str, tuple[str, ...]]] = {
        "when to cluster": ("cluster_when", "warmup_rounds", "min_coverage", "cluster_round"),
        "communities": ("similarity", "resolution", "max_cross_ratio", "backend"),
        "after clustering": ("restart", "recheck", "placement_delay", "max_placement_wait"),
        "memory at scale": ("sketch", "neighbours"),
    }

    similarity: Literal["cosine", "euclidean", "manhattan"] = Field(
        "cosine", description="measure between the stored latest updates")
    cluster_when: Literal["groups", "settled"] = Field(
        "groups", description="groups: cluster once the split test finds groups in the global "
        "model's updates (a federation without groups stays one cluster); settled: once "
        "FedAvg has settled, the paper's rule (use it to reproduce the paper)")
    warmup_rounds: int = Field(10, ge=1, description="cluster_when settled: rounds of FedAvg "
                               "before clustering")
    min_coverage: float = Field(0.25, ge=0, le=1, description="share of clients seen before "
                                "clustering; 1.0 when attackers are about, so that none "
                                "chooses its cluster at placement")
    cluster_round: int | None = Field(None, ge=1, description="cluster at this round, "
                                      "whatever cluster_when says")
    resolution: float = Field(1.0, gt=0, description="Louvain resolution (higher: more, "
                              "smaller communities)")
    max_cross_ratio: float = Field(0.25, gt=0, le=1, description="communities whose mean "
                                   "between/within edge-weight ratio exceeds this are merged; "
                                   "raise it to keep weaker groups apart")
    backend: Literal["igraph", "networkx"] = Field("igraph", description="Louvain "
                                                   "implementation (same method; igraph is "
                                                   "faster on large graphs)")
    placement_delay: int = Field(3, ge=0, description="rounds every cluster trains before "
                                 "newcomers are placed (before that the models barely differ)")
    max_placement_wait: int = Field(100, ge=0, description="rounds after clustering when "
                                    "newcomers are placed anyway")
    restart: Literal["global", "initial"] = Field(
        "global", description="clusters start from the global model, or from the initial one "
        "(after a poisoned FedAvg phase)")
    recheck: bool = Field(True, description="keep examining every cluster after clustering "
                          "and split it when its members' updates hold groups")
    sketch: int | Literal["auto"] | None = Field(
        "auto", description="store a count sketch of this many dimensions per client instead of "
        "its full update (null: never; auto: 4096 when every client's full update would take "
        "more than 4 GiB)")
    neighbours: int | Literal["auto"] | None = Field(
        "auto", description="keep each client's this many closest others instead of the n x n "
        "matrix, and cluster their sparse k-nearest-neighbour graph (null: the whole matrix; "
        "auto: ceil(3 ln n) when the matrix of every client would take more than 1 GiB)")

    @model_validator(mode="after")
    def _sketchable(self) -> IncrementalParams:
        if isinstance(self.sketch, int) and self.similarity not in SKETCHABLE:
            raise ValueError(f"sketch: a sketch preserves inner products, not {self.similarity} "
                             "distances (use cosine or euclidean, or sketch: null)")
        if isinstance(self.sketch, int) and self.sketch < 16:
            raise ValueError("sketch: at least 16 dimensions")
        if isinstance(self.neighbours, int) and self.neighbours < SELF_TUNING_NEIGHBOUR:
            raise ValueError(f"neighbours: at least {SELF_TUNING_NEIGHBOUR} (the self-tuning "
                             "scale of distances is the 7th neighbour's)")
        return self

    def thresholds(self) -> list[dict[str, Any]]:
        return super().thresholds() if self.recheck else []


@ALGORITHMS.register("incremental",
                     "FedAvg filling a similarity matrix as clients are sampled, then Louvain "
                     "communities (partial participation, poisoning defence)")
class Incremental(ClusteredAlgorithm):
    name = "incremental"
    Params = IncrementalParams
    state_fields = ("store", "changes", "clustered_round", "trained_rounds", "evidence",
                    "watches")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        p = self.params
        self.store = update_store(p.similarity, self.num_clients, self.update_size, p.sketch,
                                  p.neighbours, self.context.seed)
        self.trigger = ClusteringTrigger(p.cluster_when, p.warmup_rounds, p.min_coverage,
                                         p.cluster_round)
        self.stability = Stabilisation(p.patience, p.stable_tol)  # the global model's
        self.evidence = GroupEvidence(p.patience)
        self.watches = SplitWatches(p.window_rule(p.min_cluster_size))
        self.clustered_round: int | None = None
        self.trained_rounds: dict[int, int] = {}  # cluster -> rounds it trained since clustering
        self._offered: dict[int, list[int]] = {}  # client -> the clusters its task scores
        self._stacks: dict[tuple[int, ...], tuple[list[torch.Tensor], torch.Tensor]] = {}

    # -- FedAvg, then the clustering step --------------------------------------------------
    def aggregate_train(self, rnd: int, replies: list[Reply]) -> dict[str, Any]:
        if self.clustered_round is not None:
            out = super().aggregate_train(rnd, replies)
            for diag in out["clusters"]:
                if diag["replied"]:
                    self.trained_rounds[diag["id"]] = self.trained_rounds.get(diag["id"], 0) + 1
            return out
        t0 = time.perf_counter()
        self.evidence.most_replies = max(self.evidence.most_replies, len(replies))
        if replies:
            self.store.add([r.client for r in replies],
                           torch.stack([r.update[: self.update_size] for r in replies]))
        seconds = time.perf_counter() - t0
        before = self._clusters[0].params[: self.update_size].clone()
        out = super().aggregate_train(rnd, replies)
        change = self.stability.add(before, self._clusters[0].params[: self.update_size])
        out.update(stored=len(self.store), relative_change=round(change, 6),
                   similarity_seconds=round(seconds, 6),
                   similarity_mb=round(self.store.nbytes / 2**20, 3))
        why = self.trigger.due(rnd, len(self.store), self.num_clients, self.evidence,
                               self.stability.stable())
        if why is not None:
            self._cluster(rnd, out, why)
        return out

    def _cluster(self, rnd: int, out: dict[str, Any], why: str) -> None:
        """Louvain's communities of the stored updates become the clusters; the clients never
        seen wait with the global model until they are placed."""
        p = self.params
        t0 = time.perf_counter()
        found = cluster_store(self.store, self.num_clients, self.evidence.cuts,
                              p.max_cross_ratio, p.resolution, p.backend)
        self.clustered_round = rnd
        out.update(clustered=why, clustering_seconds=round(time.perf_counter() - t0, 4),
                   **found.diagnostics)
        if len(found.parts) >= 2:
            score = self.evidence.score
            figures = found.figures | {"when": why} | (
                {SCORE_FIGURE[p.split_statistic]: round(score, 4)}
                if why == "groups" and score is not None else {})
            parent = self._clusters[0]
            start = parent.params if p.restart == "global" else self.context.initial
            self._clusters = self.split(rnd, parent, Split(found.parts, figures, found.matrix),
                                        start)
            self._index_members()
        self.store.release()

    # -- the split test: on the global model before clustering, on every cluster after ------
    def partition(self, rnd: int, cluster: Cluster, replies: list[Reply],
                  diag: dict[str, Any]) -> Split | None:
        p = self.params
        if self.clustered_round is None:
            if p.cluster_when == "groups":  # evidence of groups, tested on until clustering
                examined = self._examine(cluster, replies, diag)
                if examined is not None:
                    found, fired = examined
                    self.evidence.observe(self._cut(found),
                                          found.stats.score(p.split_statistic), fired)
            return None
        if not p.recheck or len(cluster.members) < p.min_cluster_size:
            return None
        examined = self._examine(cluster, replies, diag)
        if examined is None or not examined[1]:
            return None
        found = examined[0]
        held = found.window.clients
        return Split(self._cut(found), {"rule": "recheck", **found.stats.figures(),
                                        "examined": len(held),
                                        "cluster_size": len(cluster.members)},
                     (held, found.window.similarity))

    def _examine(self, cluster: Cluster, replies: list[Reply], diag: dict[str, Any]
                 ) -> tuple[Examination, bool] | None:
        """The cluster's closed window and whether its split test fired (None: still open)."""
        p = self.params
        found = self.watches.examine(cluster.id, cluster.members, cluster.params, replies,
                                     self.update_size)
        if found is None:
            return None
        diag.update(pseudo_f=round(found.stats.pseudo_f, 4),
                    kway_f=round(found.stats.kway_f, 4), examined=len(found.window.clients))
        score = found.stats.score(p.split_statistic)
        return found, self.watches[cluster.id].fires(score, p.f_threshold)

    def _cut(self, found: Examination) -> list[list[int]]:
        """The parts (client ids) the split test's cut makes of a window."""
        p = self.params
        held = found.window.clients
        return [[held[i] for i in part]
                for part in found.stats.split(p.split_statistic, p.split_into)]

    def on_split(self, rnd: int, parent: Cluster, children: list[Cluster], split: Split
                 ) -> None:
        self.watches.drop(parent.id)  # its heirs start afresh

    # -- placing the clients that wait ------------------------------------------------------
    def configure_train(self, rnd: int, clients: list[int]) -> list[Task]:
        if not self._ready_to_place(rnd):  # unplaced clients sit the round out
            clients = [c for c in clients if c not in self._unplaced]
        return super().configure_train(rnd, clients)

    def _ready_to_place(self, rnd: int) -> bool:
        p = self.params
        if self.clustered_round is not None and rnd - self.clustered_round >= \
                p.max_placement_wait:
            return True
        return all(self.trained_rounds.get(c.id, 0) >= p.placement_delay for c in self._clusters)

    def placement_task(self, rnd: int, client: int, train: bool = True) -> Task:
        """Score the models of the clusters descending from the one the client waits from
        (never seen: every cluster), so a client cannot use its placement to leave its
        community, e.g. an attacker choosing the benign model."""
        offered = self.descendants(self._unplaced[client])
        self._offered[client] = [c.id for c in offered]
        return Select(client, rnd, self._stack_of(offered), criterion="accuracy", train=train)

    def _stack_of(self, clusters: list[Cluster]) -> torch.Tensor:
        """The (K, P) stack of these cluster models, built once while they stay the same: every
        select task of a round with these clusters in this order shares it (thousands of
        placements would otherwise hold thousands of copies)."""
        params = [c.params for c in clusters]  # held, so they cannot be freed and reused
        key = tuple(c.id for c in clusters)
        held = self._stacks.get(key)
        if held is None or any(a is not b for a, b in zip(held[0], params, strict=True)):
            current = {c.id for c in self._clusters}
            self._stacks = {k: v for k, v in self._stacks.items() if set(k) <= current}
            held = self._stacks[key] = (params, torch.stack(params))
        return held[1]

    def final_tasks(self, rnd: int, clients: list[int]) -> list[Task]:
        """Placed on their scores alone: after the last round no update would be aggregated
        (training them would cost a local training and a full update per client: 22 GB for
        the 70,000 clients still unplaced at the end of the 100,000-client benchmark)."""
        return [self.placement_task(rnd, c, train=False) for c in clients if c in self._unplaced]

    def place(self, reply: Reply) -> tuple[Cluster | None, bool]:
        offered = self._offered.pop(reply.client, [])
        if reply.choice is None or not 0 <= reply.choice < len(offered):
            return None, False
        return next(c for c in self._clusters if c.id == offered[reply.choice]), True

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {
            "store": self.store.state_dict(), "changes": self.stability.changes,
            "clustered_round": self.clustered_round, "trained_rounds": self.trained_rounds,
            "evidence": self.evidence.state_dict(), "watches": self.watches.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.store = IncrementalSimilarity.from_state(state["store"])
        self.stability.changes = list(state["changes"])
        self.clustered_round = state["clustered_round"]
        self.trained_rounds = {int(k): v for k, v in state["trained_rounds"].items()}
        self.evidence.load_state_dict(state["evidence"])
        self.watches.load_state_dict(state["watches"])
