"""Incremental clustering's step (Louvain on the latest update of every client seen): the store
that keeps those updates, when to cluster them, their graph and its communities.

The clustering runs once, on updates of different ages; what keeps two parts of a community
apart is evidence from same-round updates, the cuts of the windows on which the global model's
split test fired (`GroupEvidence`, `separated_share`). Why each rule: docs/methods/incremental.md.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

import numpy as np

from fedflock.clustering.communities import (
    SELF_TUNING_NEIGHBOUR,
    affinity,
    block_means,
    cross_ratio,
    knn_affinity,
    knn_scale,
    modularity,
    nested_communities,
    separated_share,
)
from fedflock.similarity.incremental import SKETCHABLE, IncrementalSimilarity

SKETCH_SIZE = 4096  # dimensions of a sketched update: cosine error about 0.02
AUTO_SKETCH_BYTES = 4 * 2**30  # `sketch: auto` sketches when full updates could exceed this
AUTO_NEIGHBOUR_BYTES = 2**30  # `neighbours: auto` keeps lists when the matrix could exceed this
MERGE_SAMPLE = 4000  # members (all communities together) whose pairs estimate the merge test
# on a k-NN graph: at most 200 per community, at least 20

Auto = int | Literal["auto"] | None


def neighbours_for(clients: int) -> int:
    """k of the k-nearest-neighbour graph of `clients` clients: ceil(3 ln n). A k-NN graph of
    points drawn from one smooth density is connected with high probability once k exceeds
    about 0.5 ln n (Balister et al. 2005), so each community stays in one piece with a
    margin; and k stays far below the size of any community worth finding (35 at 100,000)."""
    return max(SELF_TUNING_NEIGHBOUR, math.ceil(3 * math.log(max(clients, 2))))


def update_store(similarity: str, clients: int, update_size: int, sketch: Auto,
                 neighbours: Auto, seed: int) -> IncrementalSimilarity:
    """The store of latest updates; `auto` sketches the updates when all of them would take
    more than AUTO_SKETCH_BYTES, and keeps neighbour lists when the matrix would take more
    than AUTO_NEIGHBOUR_BYTES."""
    if sketch == "auto":
        full = clients * update_size * 4
        sketch = SKETCH_SIZE if similarity in SKETCHABLE and full > AUTO_SKETCH_BYTES else None
    if neighbours == "auto":
        neighbours = neighbours_for(clients) if clients ** 2 * 4 > AUTO_NEIGHBOUR_BYTES else None
    return IncrementalSimilarity(similarity, clients, sketch, seed, neighbours)


@dataclass
class GroupEvidence:
    """What the global model's split test showed before clustering: the cuts (client ids) of
    its last `patience` windows, and once it fired, its score and those cuts."""

    patience: int
    recent: deque[list[list[int]]] = field(init=False)
    score: float | None = None  # of the window that fired
    cuts: list[list[list[int]]] = field(default_factory=list)
    most_replies: int = 0  # the most replies a round has brought

    def __post_init__(self) -> None:
        self.recent = deque(maxlen=self.patience)

    def observe(self, cut: list[list[int]], score: float, fired: bool) -> None:
        self.recent.append(cut)
        if fired and self.score is None:
            self.score, self.cuts = score, list(self.recent)

    def state_dict(self) -> dict[str, Any]:
        return {"recent": list(self.recent), "score": self.score, "cuts": self.cuts,
                "most_replies": self.most_replies}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.recent = deque(state["recent"], maxlen=self.patience)
        self.score, self.cuts = state["score"], state["cuts"]
        self.most_replies = state["most_replies"]


@dataclass(frozen=True)
class ClusteringTrigger:
    """When the stored updates are clustered: at `cluster_round` if set; otherwise once
    `min_coverage` of the clients were seen and either the split test found groups
    (`groups`, when some round brought two replies) or FedAvg has settled after
    `warmup_rounds` (`settled`, the paper's rule)."""

    cluster_when: Literal["groups", "settled"]
    warmup_rounds: int
    min_coverage: float
    cluster_round: int | None

    def due(self, rnd: int, seen: int, total: int, evidence: GroupEvidence, settled: bool
            ) -> str | None:
        """Why to cluster at round `rnd` with `seen` of `total` clients seen, or None."""
        if self.cluster_round is not None and rnd >= self.cluster_round:
            return "cluster_round"
        if seen < self.min_coverage * total:
            return None
        if self.cluster_when == "groups" and evidence.most_replies >= 2:
            return "groups" if evidence.score is not None else None
        return "settled" if rnd >= self.warmup_rounds and settled else None


@dataclass
class StoreGraph:
    """The graph of the clients seen: their ids, the weights, the `block_means` of a partition
    (rows) of them, and the matrix a decision keeps (None with neighbour lists)."""

    clients: list[int]
    weights: Any
    means: Callable[[list[list[int]]], np.ndarray]
    matrix: tuple[list[int], np.ndarray] | None


def store_graph(store: IncrementalSimilarity) -> StoreGraph:
    """With neighbour lists the graph is their sparse k-NN graph, and the mean weights of
    `merge_close` are estimated from the pairs of a sample of each community's members
    (MERGE_SAMPLE in all): the statistic the whole matrix gives, which a k-NN graph would not
    (its within/between edge densities differ by construction). For distances, each client's
    self-tuning scale is the 7th distance its list has kept."""
    if store.lists is None:
        clients, values = store.values()
        weights = affinity(values.numpy(), store.is_similarity)
        return StoreGraph(clients, weights, lambda parts: block_means(weights, parts),
                          (clients, values.numpy()))
    clients, index, value = store.neighbour_lists()
    weights = knn_affinity(index.numpy(), value.numpy(), store.is_similarity)
    scale = None if store.is_similarity else knn_scale(value.numpy())

    def sampled_means(parts: list[list[int]]) -> np.ndarray:
        rng = np.random.default_rng(0)
        each = max(20, min(200, MERGE_SAMPLE // len(parts)))
        picked = [sorted(rng.choice(part, min(len(part), each), replace=False))
                  for part in parts]
        rows = [int(i) for part in picked for i in part]
        sub = affinity(store.among(rows).numpy(), store.is_similarity,
                       None if scale is None else scale[rows])
        bounds = np.cumsum([0] + [len(part) for part in picked])
        return block_means(sub, [list(range(a, b)) for a, b in pairwise(bounds)])

    return StoreGraph(clients, weights, sampled_means, None)


def windows_apart(cuts: list[list[list[int]]], clients: list[int]
                  ) -> Callable[[list[int], list[int]], bool | None] | None:
    """Whether two parts of a Louvain community (rows of `clients`) stay apart: when the
    windows' `cuts` set most of their members' pairs in different parts (None: no window
    held a member of each; no test at all without cuts)."""
    def apart(a: list[int], b: list[int]) -> bool | None:
        share = separated_share(cuts, [clients[i] for i in a], [clients[i] for i in b])
        return None if share is None else share > 0.5

    return apart if cuts else None


@dataclass
class StoreClustering:
    parts: list[list[int]]  # client ids of each community, largest first
    figures: dict[str, Any]  # what the decision records
    diagnostics: dict[str, Any]  # what the round records
    matrix: tuple[list[int], np.ndarray] | None


def cluster_store(store: IncrementalSimilarity, total: int, cuts: list[list[list[int]]],
                  max_cross_ratio: float, resolution: float, backend: str) -> StoreClustering:
    """Louvain's nested communities of the stored updates of some of `total` clients
    (`nested_communities`), their parts kept apart by the windows' `cuts` where those hold
    members of both."""
    graph = store_graph(store)
    nested = nested_communities(graph.weights, graph.means, max_cross_ratio, resolution,
                                seed=0, backend=backend,
                                apart=windows_apart(cuts, graph.clients))
    found, final = nested.first, nested.parts
    diagnostics = {"modularity": round(found.modularity, 4),
                   "cross_ratio": round(cross_ratio(graph.means(found.parts), found.parts), 4),
                   "louvain_communities": len(found.parts),
                   "one_level_communities": len(nested.merged), "communities": len(final)}
    figures = {"modularity": round(modularity(graph.weights, final), 4),
               "cross_ratio": round(cross_ratio(graph.means(final), final), 4),
               "unseen": total - len(graph.clients),
               "one_level": len(nested.merged)}  # before the nested step
    parts = [[graph.clients[i] for i in part] for part in final]
    return StoreClustering(parts, figures, diagnostics, graph.matrix)
