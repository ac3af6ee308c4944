"""Clustered Federated Learning (Sattler, Müller, Samek, arXiv 1910.01991).

FedAvg per cluster; when a cluster's members stop agreeing, split it along the min-max merge
tree of the cosine similarity of their weight-updates, record the split in the parameter tree
and go on in each part. Clients absent when their cluster split are routed down the parameter
tree the next time they are sampled (Algorithm 4 of the paper).

Departures from the paper, with their reasons and measurements, are in `docs/methods/cfl.md`:
the default split rule (`auto`) is a scale-free pseudo-F over windows of updates instead of
the eps1/eps2 norms (`split_rule: eps` is the paper's); a cluster splits into every part of
the best cut (`split_into: two` is the paper's recursive bipartition); under partial
participation a window may span rounds once the cluster's model has settled.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator

from fedflock.algorithms.base import Cluster
from fedflock.algorithms.clustered import ClusteredAlgorithm, Split
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.algorithms.windowed_split import SplitTestParams
from fedflock.client.tasks import Gradient, Train
from fedflock.clustering import ParameterTree
from fedflock.clustering.split_stats import SplitStats
from fedflock.clustering.watch import SplitWatch, SplitWatches
from fedflock.wire import Reply, Task


class CFLParams(SplitTestParams):
    field_groups: ClassVar[dict[str, tuple[str, ...]]] = {
        "split rule": ("split_rule", "eps1", "eps2", "gamma_check"),
        "split test": ("warmup_rounds", "linkage", "max_clusters"),
        "windows under partial participation": ("min_replies",),
        "updates and routing": ("update", "tree_updates"),
    }

    split_rule: Literal["auto", "eps"] = Field(
        "auto", description="auto: split when the pseudo-F (split_statistic) exceeds "
        "f_threshold, whatever the scale of the updates; eps: the paper's rule, mean-update "
        "norm below eps1 and largest client-update norm above eps2, with its bipartition")
    warmup_rounds: int = Field(10, ge=0, description="rounds of FedAvg before any split; "
                               "lower it when groups are obvious and rounds are few")
    eps1: float | None = Field(None, gt=0, description="eps: mean-update norm below which the "
                               "cluster is near a stationary point")
    eps2: float | None = Field(None, gt=0, description="eps: largest client-update norm above "
                               "which clients still disagree")
    gamma_check: bool | None = Field(
        None, description="accept a split only if gamma_max < sqrt((1 - alpha_cross_max) / 2), "
        "the paper's guarantee that it separates distributions (default: on for eps, off for "
        "auto); turning it on makes every split a bipartition")
    linkage: Literal["single", "complete"] = Field(
        "single", description="merge tree of the similarity: single, the paper's min-max cut; "
        "complete, the authors' code")
    min_replies: int = Field(5, ge=2, description="fewest distinct members' updates in a "
                             "window")
    max_clusters: int | None = Field(None, ge=1, description="stop splitting at this many "
                                     "clusters (a split that would pass it is a bipartition)")
    tree_updates: int | None = Field(
        64, ge=1, description="updates kept per parameter-tree edge to route new clients, the "
        "most spread out (null: all of them, as the paper; memory grows with every split)")
    update: Literal["weights", "gradients"] = Field(
        "weights", description="weights: local SGD updates; gradients: one full-batch gradient "
        "step (the paper's gradient variant)")

    @model_validator(mode="after")
    def _eps_given(self) -> CFLParams:
        if self.split_rule == "eps" and (self.eps1 is None or self.eps2 is None):
            raise ValueError("split_rule 'eps' needs eps1 and eps2")
        return self

    def thresholds(self) -> list[dict[str, Any]]:
        if self.split_rule == "eps":
            return [{"statistic": "mean_norm", "value": self.eps1, "label": "eps1"},
                    {"statistic": "max_norm", "value": self.eps2, "label": "eps2"}]
        return super().thresholds()


@ALGORITHMS.register("cfl", "Clustered FL (Sattler et al.): recursive splits by update cosine")
class CFL(ClusteredAlgorithm):
    name = "cfl"
    Params = CFLParams
    state_fields = ("tree", "watches")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.param_tree = ParameterTree(self.params.tree_updates)
        self.param_tree.add_root(self._clusters[0].id, self._clusters[0].members)
        self.watches = SplitWatches(self.params.window_rule(self.params.min_replies))

    @classmethod
    def newcomer_router(cls, state: dict[str, Any], params: Any) -> ParameterTree:
        return ParameterTree.from_dict(state["tree"])

    def train_task(self, rnd: int, client: int, params: torch.Tensor) -> Task:
        if self.params.update == "gradients":
            return Gradient(client, rnd, params)
        return Train(client, rnd, params)

    def _fires(self, watch: SplitWatch, stats: SplitStats) -> bool:
        p = self.params
        if p.split_rule == "eps":
            return stats.mean_norm < p.eps1 and stats.max_norm > p.eps2
        return watch.fires(stats.score(p.split_statistic), p.f_threshold)

    def partition(self, rnd: int, cluster: Cluster, replies: list[Reply],
                  diag: dict[str, Any]) -> Split | None:
        p = self.params
        if len(cluster.members) < p.min_cluster_size:
            return None
        found = self.watches.examine(cluster.id, cluster.members, cluster.params, replies,
                                     self.update_size, p.linkage)
        if found is None:
            return None  # the window is still open (patience neither advances nor resets)
        window, stats = found.window, found.stats
        diag.update(mean_norm=round(stats.mean_norm, 6), max_norm=round(stats.max_norm, 6),
                    pseudo_f=round(stats.pseudo_f, 4), kway_f=round(stats.kway_f, 4),
                    gap=round(stats.gap, 4))
        if rnd < p.warmup_rounds or not self._fires(self.watches[cluster.id], stats):
            return None  # (a warm-up window does not count toward patience)
        gamma_check = p.gamma_check if p.gamma_check is not None else p.split_rule == "eps"
        if gamma_check and not stats.gamma_max < stats.gamma_bound:
            return None  # (gamma and alpha describe the bipartition: with the check on, it is made)
        if p.max_clusters is not None and len(self._clusters) >= p.max_clusters:
            return None
        positions = stats.split(p.split_statistic, p.split_into)
        room = None if p.max_clusters is None else p.max_clusters - len(self._clusters) + 1
        if p.split_rule == "eps" or gamma_check or (room is not None and len(positions) > room):
            positions = [list(part) for part in stats.parts]  # the paper's bipartition
        members = window.clients
        return Split([[members[i] for i in part] for part in positions], stats.figures(),
                     (members, window.similarity), window.updates)

    def on_split(self, rnd: int, parent: Cluster, children: list[Cluster], split: Split
                 ) -> None:
        """Keep the split in the parameter tree, each edge with its part's updates."""
        self.watches.drop(parent.id)
        assert split.matrix is not None and split.updates is not None
        row = {client: i for i, client in enumerate(split.matrix[0])}
        self.param_tree.record_split(parent.id, rnd, parent.params, [
            (child.id, part, split.updates[torch.tensor([row[c] for c in part])])
            for child, part in zip(children, split.parts, strict=True)])

    def place(self, reply: Reply) -> tuple[Cluster | None, bool]:
        """Route a waiting client one level down the parameter tree by its update at the
        waiting model; it joins the child if that is a current cluster, else waits there."""
        node = self._unplaced[reply.client]
        child, _ = self.param_tree.step(node, reply.update[: self.update_size])
        self.param_tree.nodes[child].members.append(reply.client)
        leaf = next((c for c in self._clusters if c.id == child), None)
        if leaf is None:  # the child has split since: wait at it, with the model it split from
            self.wait(reply.client, child, self.param_tree.nodes[child].params)
        return leaf, False

    def tree(self) -> list[dict[str, Any]]:
        return self.param_tree.describe()

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"tree": self.param_tree.to_dict(),
                                       "watches": self.watches.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.param_tree = ParameterTree.from_dict(state["tree"], self.params.tree_updates)
        self.watches.load_state_dict(state["watches"])
