"""Federated learning with incremental clustering (FL + Louvain), for partial participation.

During FedAvg the server keeps the latest update of every client it has sampled and fills a
similarity matrix incrementally (`fedflock.similarity.IncrementalSimilarity`): no communication
beyond FedAvg's. Once FedAvg has stabilised it finds the communities of the similarity graph with
Louvain and runs FedAvg per community. A client never sampled before clustering is placed the
first time it is sampled afterwards, once every cluster model has been trained in at least
`placement_delay` rounds since clustering (before that the models barely differ, and a client
placed on noise would pull a cluster towards its own group; `max_placement_wait` rounds after
clustering it is placed anyway, should a community never be sampled): it scores every cluster
model on its own training data, trains the most accurate one and joins that cluster.

When to cluster (`cluster_when`). `groups` (default): once the split test described below,
run on the global model's own windows of same-round updates, finds groups there (`patience`
windows in a row above `f_threshold`: CFL's evidence that the federation holds incongruent
clients, scale-free), and at least `min_coverage` of the clients have been seen; then Louvain
partitions the stored updates, as in the paper. A federation without groups is never clustered,
and a run with few replies a round clusters only once its windows show groups, not at the
first round the global model looks settled. When every round so far brought a single reply the
split test sees nothing (one update shows no disagreement at its model, see
`clustering.watch`), and the paper's rule decides instead. `settled` (the paper's rule): at
least `warmup_rounds` rounds done, the relative change of the global model r_t = ||w_t -
w_{t-1}|| / ||w_{t-1}|| has stopped shrinking (its mean over the last `patience` rounds is down
by less than `stable_tol` from the mean over the `patience` rounds before: scale-free,
whatever the learning rate), and at least `min_coverage` of the clients seen. A departure from
the paper, measured on the scenario grid (README): the settled test fired at the earliest
round allowed in 31 of 60 runs, i.e. it detected nothing, and Louvain on the few clients seen
then lumped groups that the later split test, starved of same-round replies in the smaller
clusters, could not part again. Either way round `cluster_round`, if set, clusters whatever the
rest says. Louvain always returns
some partition, so communities that are not really apart are merged back (`merge_close`): two
stay apart only while the mean edge weight between them is at most `max_cross_ratio` times the
mean weight within them (measured: 0.45-0.55 for IID clients whose stale updates Louvain cut by
age, below 0.06 for true groups and attackers). Each community is then partitioned again on
its own subgraph (`nested_communities`, a departure from the paper, which runs Louvain once):
modularity at resolution 1 joins two communities whenever the weight between them exceeds
what the whole graph's mean weight predicts, so many small groups come out lumped in pairs
(on the grid, 7 label-swap groups of ~5 clients gave 5 or 6 communities). Two parts of a
community stay apart when the windows the split test fired on (their cuts, as client ids:
`group_cuts`) set most pairs of their members apart, among the pairs a window held (not
counting a member alone in its part: `separated_share`); where no window held a member of
each (or without windows: `cluster_when: settled`), when the ratio test above keeps them
apart. Why the windows: their updates were computed at one model and
differ by data, while the stored ones differ by age too, and on the grid no ratio told the
two apart (the clustering rounds' graphs, seeds 0-2: label groups Louvain lumped 0.11-0.58,
Louvain's cuts within one group 0.46-0.95), while the windows set apart none of the pairs of
any cut within a group (37 cuts) and most of those of 15 of 21 lumped label-group pairs
(12 probed seed-0 cells and `digits-label_swap-g7-n39` on seeds 0-2; the other 6 stay
lumped, as before).
If one community remains, FedAvg goes on (and the split test below keeps examining it).

Clustering is not final (`recheck`, on by default). Every cluster, the single one included
when Louvain found no groups, keeps being examined on what its members already send, by the
split test CFL uses (`fedflock.clustering.watch.SplitWatch`): its members' updates are collected
in windows, each closed as soon as it holds updates of `window_coverage` of the members (one
round under full participation; several only once the cluster's own model has stabilised, by
the test above counted on the cluster's own rounds), and each scored by the scale-free pseudo-F
of the best cut of the min-max merge tree of their cosine matrix (`split_statistic`, as CFL's).
Above `f_threshold` in `patience` windows in a row (or `votes` of them, the latest among them),
the cluster splits into that cut (parts of fewer than `min_part_size` window members
folded into their nearest part, as CFL's; off by default) (recorded in
`splits` with the statistic that decided it, like CFL's); members that sent nothing in the
deciding window wait with the parent model and are then placed like newcomers, but only among
the parent's heirs. So an under-split (two groups
Louvain left together, or a clustering done too early) is repaired by later splits, while a
cluster without structure scores about 1 and stays whole.

Members can change cluster (`reselect`, off; `algorithms.reselection`, shared with CFL): once
clusters have settled, a sampled member scores the settled models on its own data, once per set
of them, and moves to one clearly more accurate (Fisher's exact test) if its own cluster
serves its other members clearly better and its update agrees with the chosen cluster's
members' of that round. Louvain's communities come from stale updates and can
hold a few clients of another group that no split test would cut off. It costs downlink (the
settled models, at each re-selection: +21-71% on the README's partial-participation runs) for
one paying grid cell a held-out seed, so it is off; a departure from the paper.

The re-examination can also re-run the paper's own rule inside a cluster (`recluster`, off):
Louvain on the cosines of updates its members sent in the same round, accumulated over the
rounds (they share one model, so they differ by data, not age, unlike the store of latest
updates the first clustering used), once the cluster's model has settled; communities found on
alternate rounds are judged on the others and kept apart only when confidence bounds show
them apart (`clustering.coround`; all of a cluster's tests share `recluster_level`). No extra
communication; O(m^2) sums for a cluster of m members (not above `coround.MAX_MEMBERS`).

Over-splits can be undone (`merge_test`, off: on the scenario grid it undid the one IID split
and gained no paying cell, nor did it undo a lower split bar's over-splits, whose parts are
mostly too small to test; not under attack: a merge could let attackers into a benign
cluster): mutually nearest clusters are
paired; sampled members also train the partner's model, beside their own, as many as the
pair's windows still need (a probe: a side task in the same message, so it costs the client a
second training and upload, the cluster nothing; under differential privacy it is accounted as
a second release each round), and when the split test's pseudo-F of the cut
{probes | the partner's own updates} stays at most `f_threshold` at both models for `patience`
windows, the two merge (`algorithms.merging`, shared with CFL). Until a merge, a run with the
test is the run without it. A departure from the paper, which never merges.

Model poisoning: malicious clients whose updates oppose (or ignore) the benign ones share no
positive edge with them, so they form their own communities and poison only their own models.
The global model of the FedAvg phase is poisoned, though; `restart: initial` starts every cluster
from the initial model instead of it. A malicious client never seen before clustering can still
choose the benign cluster when it is placed (it scores models on its own data): with attackers
about, ask for `min_coverage: 1.0` so every client is seen before clustering.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from itertools import pairwise
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from fedflock.algorithms.base import Cluster, Decision
from fedflock.algorithms.clustered import SplitTestParams
from fedflock.algorithms.merging import MergingAlgorithm
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.client.tasks import Select
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
from fedflock.clustering.coround import MAX_MEMBERS, SameRoundCosines, louvain_split
from fedflock.clustering.split_stats import SCORE_FIGURE
from fedflock.clustering.stability import Stabilisation
from fedflock.clustering.watch import Examination, SplitWatches
from fedflock.similarity.incremental import SKETCHABLE, IncrementalSimilarity
from fedflock.wire import Reply, Task

SKETCH_SIZE = 4096  # dimensions of a sketched update: cosine error about 0.02
AUTO_SKETCH_BYTES = 4 * 2**30  # `sketch: auto` sketches when full updates could exceed this
AUTO_NEIGHBOUR_BYTES = 2**30  # `neighbours: auto` keeps lists when the matrix could exceed this
MERGE_SAMPLE = 4000  # members (all communities together) whose pairs estimate the merge test
# on a k-NN graph: at most 200 per community, at least 20


def neighbours_for(clients: int) -> int:
    """k of the k-nearest-neighbour graph of `clients` clients: ceil(3 ln n). A k-NN graph of
    points drawn from one smooth density is connected with high probability once k exceeds
    about 0.5 ln n (Balister et al. 2005), so each community stays in one piece with a
    margin; and k stays far below the size of any community worth finding (35 at 100,000)."""
    return max(SELF_TUNING_NEIGHBOUR, math.ceil(3 * math.log(max(clients, 2))))


class IncrementalParams(SplitTestParams):
    similarity: Literal["cosine", "euclidean", "manhattan"] = Field(
        "cosine", description="measure between the stored latest updates")
    cluster_when: Literal["groups", "settled"] = Field(
        "groups", description="groups: cluster once the split test finds groups in the global "
        "model's updates (the paper's settled rule when every round brought one reply); "
        "settled: once FedAvg has settled (the paper)")
    warmup_rounds: int = Field(10, ge=1, description="cluster_when settled: rounds of FedAvg "
                               "before clustering")
    min_coverage: float = Field(0.25, ge=0, le=1, description="share of clients seen before "
                                "clustering")
    cluster_round: int | None = Field(None, ge=1, description="cluster at this round, "
                                      "whatever cluster_when says")
    resolution: float = Field(1.0, gt=0, description="Louvain resolution")
    max_cross_ratio: float = Field(0.25, gt=0, le=1, description="communities whose mean "
                                   "between/within edge-weight ratio exceeds this are merged "
                                   "(within a community, the split test's windows decide "
                                   "where they hold members of both parts)")
    backend: Literal["igraph", "networkx"] = Field("igraph", description="Louvain "
                                                   "implementation")
    placement_delay: int = Field(3, ge=0, description="rounds every cluster trains before "
                                 "newcomers are placed")
    max_placement_wait: int = Field(100, ge=0, description="rounds after clustering when "
                                    "newcomers are placed anyway")
    restart: Literal["global", "initial"] = Field(
        "global", description="clusters start from the global model, or from the initial one "
        "(after a poisoned FedAvg phase)")
    recheck: bool = Field(True, description="keep examining every cluster after clustering "
                          "and split it when its members' updates hold two groups")
    recluster: bool = Field(False, description="recheck also re-runs Louvain inside a cluster "
                            "whose model has settled, on the cosines of its members' "
                            "same-round updates accumulated over the rounds, and splits into "
                            "the communities shown apart (clustering.coround)")
    recluster_level: float = Field(0.001, gt=0, lt=0.5, description="recluster: the level "
                                   "all of a cluster's tests share, of the confidence bounds "
                                   "that must show its communities apart")
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
        if self.recluster and not self.recheck:
            raise ValueError("recluster needs recheck (it is part of a cluster's examination)")
        if self.merge_test and not self.recheck:
            raise ValueError("merge_test needs recheck (a cluster is probed once its split "
                             "test's watch finds its model settled)")
        if isinstance(self.neighbours, int) and self.neighbours < SELF_TUNING_NEIGHBOUR:
            raise ValueError(f"neighbours: at least {SELF_TUNING_NEIGHBOUR} (the self-tuning "
                             "scale of distances is the 7th neighbour's)")
        return self


@ALGORITHMS.register("incremental",
                     "FedAvg filling a similarity matrix as clients are sampled, then Louvain "
                     "communities (partial participation, poisoning defence)")
class Incremental(MergingAlgorithm):
    name = "incremental"
    Params = IncrementalParams

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.store = IncrementalSimilarity(self.params.similarity, self.num_clients,
                                           self._sketch_size(), self.context.seed,
                                           self._neighbours())
        self.initial = self._clusters[0].params.clone()
        self.stability = Stabilisation(self.params.patience, self.params.stable_tol)
        p = self.params  # every cluster's split test after clustering
        self.watches = SplitWatches(p.patience, p.stable_tol, p.window_coverage,
                                    p.min_cluster_size, p.same_round_share, p.round_window)
        self.clustered_round: int | None = None
        self.groups_score: float | None = None  # the window that fired the global model's
        # split test (cluster_when groups): its score, recorded with the clustering
        self._recent_cuts: deque[list[list[int]]] = deque(maxlen=self.params.patience)
        self.group_cuts: list[list[list[int]]] = []  # the cuts (client ids) of the windows the
        # test fired on: the evidence that keeps apart parts of a Louvain community
        self.most_replies = 0  # the most replies a round has brought before clustering
        self._offered: dict[int, list[int]] = {}
        self.children: dict[int, list[int]] = {}  # cluster -> the parts it split into (recheck)
        self.trained_rounds: dict[int, int] = {}  # cluster -> rounds it aggregated since clustering
        self.coround: dict[int, SameRoundCosines] = {}  # cluster -> its members' pairs (recluster)

    def _sketch_size(self) -> int | None:
        sketch = self.params.sketch
        if sketch != "auto":
            return sketch
        full = self.num_clients * self.update_size * 4
        sketchable = self.params.similarity in SKETCHABLE
        return SKETCH_SIZE if sketchable and full > AUTO_SKETCH_BYTES else None

    def _neighbours(self) -> int | None:
        k = self.params.neighbours
        if k != "auto":
            return k
        return neighbours_for(self.num_clients) \
            if self.num_clients ** 2 * 4 > AUTO_NEIGHBOUR_BYTES else None

    # -- FedAvg phase ------------------------------------------------------------------------
    def aggregate_train(self, rnd: int, replies: list[Reply]) -> dict[str, Any]:
        if self.clustered_round is not None:
            out = super().aggregate_train(rnd, replies)
            for diag in out["clusters"]:
                if diag["replied"]:
                    self.trained_rounds[diag["id"]] = self.trained_rounds.get(diag["id"], 0) + 1
            return out
        t0 = time.perf_counter()
        self.most_replies = max(self.most_replies, len(replies))
        if replies:
            self.store.add([r.client for r in replies],
                           torch.stack([r.update[: self.update_size] for r in replies]))
        seconds = time.perf_counter() - t0
        before = self._clusters[0].params[: self.update_size].clone()
        out = super().aggregate_train(rnd, replies)
        after = self._clusters[0].params[: self.update_size]
        change = self.stability.add(before, after)
        out.update(stored=len(self.store), relative_change=round(change, 6),
                   similarity_seconds=round(seconds, 6),
                   similarity_mb=round(self.store.nbytes / 2**20, 3))
        why = self._clustering_due(rnd)
        if why is not None:
            self._cluster(rnd, out, why)
        return out

    def _clustering_due(self, rnd: int) -> str | None:
        """Why to cluster this round (`cluster_when`), or None: not yet."""
        p = self.params
        if p.cluster_round is not None and rnd >= p.cluster_round:
            return "cluster_round"
        if len(self.store) < p.min_coverage * self.num_clients:
            return None
        if p.cluster_when == "groups" and self.most_replies >= 2:
            return "groups" if self.groups_score is not None else None
        return "settled" if rnd >= p.warmup_rounds and self.stability.stable() else None

    def _cluster(self, rnd: int, out: dict[str, Any], why: str) -> None:
        p = self.params
        t0 = time.perf_counter()
        clients, weights, means, matrix = self._graph()
        nested = nested_communities(weights, means, p.max_cross_ratio, p.resolution, seed=0,
                                    backend=p.backend, apart=self._windows_apart(clients))
        found, final = nested.first, nested.parts
        seconds = time.perf_counter() - t0
        self.clustered_round = rnd
        out.update(clustered=why, clustering_seconds=round(seconds, 4),
                   modularity=round(found.modularity, 4),
                   cross_ratio=round(cross_ratio(means(found.parts), found.parts), 4),
                   louvain_communities=len(found.parts),
                   one_level_communities=len(nested.merged), communities=len(final))
        if len(final) < 2:
            self.store.release()
            return
        parent = self._clusters[0]
        start = parent.params if p.restart == "global" else self.initial
        parts = [[clients[i] for i in part] for part in final]
        self._clusters = [self.new_cluster(sorted(members), start) for members in parts]
        seen = set(clients)
        for client in range(self.num_clients):
            if client not in seen:
                self.wait(client, parent.id, parent.params)
        self._index_members()
        self.record(Decision("split", rnd, parent.id, [c.id for c in self._clusters], parts,
                             {"modularity": round(modularity(weights, final), 4),
                              "cross_ratio": round(cross_ratio(means(final), final), 4),
                              "unseen": self.num_clients - len(seen), "when": why,
                              "one_level": len(nested.merged),  # before the nested step
                              **({SCORE_FIGURE[p.split_statistic]: round(self.groups_score, 4)}
                                 if why == "groups" and self.groups_score is not None
                                 else {})},
                             matrix))
        self.store.release()

    def _windows_apart(self, clients: list[int]
                       ) -> Callable[[list[int], list[int]], bool | None] | None:
        """Whether two parts of a Louvain community (rows of `clients`) stay apart: when the
        windows the split test fired on set most of their members' pairs in different parts
        of their cuts (None: no window held a member of each, or none fired)."""
        cuts = self.group_cuts

        def apart(a: list[int], b: list[int]) -> bool | None:
            share = separated_share(cuts, [clients[i] for i in a], [clients[i] for i in b])
            return None if share is None else share > 0.5

        return apart if cuts else None

    def _graph(self) -> tuple[list[int], Any, Any, tuple[list[int], Any] | None]:
        """(clients seen, their graph, the `block_means` of a partition of them, the matrix
        a decision keeps). With neighbour lists the graph is their sparse k-NN graph, and the
        merge test's mean weights are estimated from the pairs of a sample of each community's
        members (MERGE_SAMPLE in all, so its matrix stays small whatever Louvain found): the
        statistic the whole matrix gives, which a k-NN graph would not (its within/between
        edge densities differ by construction). For distances, each client's self-tuning
        scale is the 7th distance its list has kept (at least the true 7th-nearest's)."""
        store = self.store
        if store.lists is None:
            clients, values = store.values()
            weights = affinity(values.numpy(), store.is_similarity)
            return clients, weights, lambda parts: block_means(weights, parts), \
                (clients, values.numpy())
        clients, index, value = store.neighbour_lists()
        weights = knn_affinity(index.numpy(), value.numpy(), store.is_similarity)
        scale = None if store.is_similarity else knn_scale(value.numpy())

        def sampled_means(parts: list[list[int]]) -> Any:
            rng = np.random.default_rng(0)
            each = max(20, min(200, MERGE_SAMPLE // len(parts)))
            picked = [sorted(rng.choice(part, min(len(part), each), replace=False))
                      for part in parts]
            rows = [int(i) for part in picked for i in part]
            sub = affinity(store.among(rows).numpy(), store.is_similarity,
                           None if scale is None else scale[rows])
            bounds = np.cumsum([0] + [len(part) for part in picked])
            return block_means(sub, [list(range(a, b)) for a, b in pairwise(bounds)])

        return clients, weights, sampled_means, None

    # -- after clustering: every cluster keeps being examined -------------------------------
    def partition(self, rnd: int, cluster: Cluster, replies: list[Reply],
                  diag: dict[str, Any]) -> list[list[int]] | None:
        p = self.params
        if self.clustered_round is None:
            if p.cluster_when == "groups":  # tested on until clustering (coverage may lag)
                found = self._split_test(cluster, replies, diag)
                if found is not None and self.groups_score is None:
                    self.groups_score = found.stats.score(p.split_statistic)
                    self.group_cuts = list(self._recent_cuts)
            return None
        if not p.recheck or len(cluster.members) < p.min_cluster_size:
            return None
        found = self._split_test(cluster, replies, diag)
        if found is None:
            return self._recluster(rnd, cluster, replies, diag)
        held = found.window.clients
        positions = found.stats.split(p.split_statistic, p.split_into,
                                      found.window.similarity, p.min_part_size)
        if len(positions) < 2:
            diag.update(lone_parts_only=True)  # the cut set only single outliers apart
            return self._recluster(rnd, cluster, replies, diag)
        parts = [[held[i] for i in part] for part in positions]
        children = list(range(self._next_id, self._next_id + len(parts)))
        self.record(Decision("split", rnd, cluster.id, children,
                             parts, {"rule": "recheck", **found.stats.figures(),
                                     "examined": len(held), "cluster_size": len(cluster.members)},
                             (held, found.window.similarity)))
        self._split(cluster, children)
        return parts

    def _split_test(self, cluster: Cluster, replies: list[Reply], diag: dict[str, Any]
                    ) -> Examination | None:
        """This round's replies into the cluster's split test (`clustering.watch`); the closed
        window's examination when the test fires, else None. Before clustering it runs on the
        global model (`cluster_when`), after it on each cluster (`recheck`)."""
        p = self.params
        found = self.watches.examine(cluster.id, cluster.members, cluster.params, replies,
                                     self.update_size)
        if found is None:
            return None
        diag.update(pseudo_f=round(found.stats.pseudo_f, 4),
                    kway_f=round(found.stats.kway_f, 4), examined=len(found.window.clients))
        if self.clustered_round is None:  # the global model's: kept for `_cluster`
            held = found.window.clients
            self._recent_cuts.append([[held[i] for i in part] for part in found.stats.split(
                p.split_statistic, p.split_into, found.window.similarity, p.min_part_size)])
        score = found.stats.score(p.split_statistic)
        return found if self.watches[cluster.id].fires(score, p.f_threshold, p.votes) else None

    def _split(self, cluster: Cluster, children: list[int]) -> None:
        self.watches.drop(cluster.id)
        self.coround.pop(cluster.id, None)
        self.children[cluster.id] = children

    def _recluster(self, rnd: int, cluster: Cluster, replies: list[Reply],
                   diag: dict[str, Any]) -> list[list[int]] | None:
        """Louvain on the cluster's accumulated same-round cosines, once its model has settled
        and a test is due (`clustering.coround`); the parts it shows apart, or None."""
        p = self.params
        if not p.recluster or len(cluster.members) > MAX_MEMBERS:
            self.coround.pop(cluster.id, None)  # grown past it: its sums would go stale
            return None
        cosines = self.coround.setdefault(cluster.id, SameRoundCosines())
        cosines.add([r.client for r in replies],
                    torch.stack([r.update[: self.update_size] for r in replies]))
        if not self.watches[cluster.id].stability.stable():
            return None
        share = cosines.look()
        if share is None:
            return None
        found = louvain_split(cosines, p.max_cross_ratio, p.recluster_level * share,
                              p.min_cluster_size, p.resolution, p.backend)
        if found is None:
            return None
        diag.update(recluster_parts=len(found.parts))
        children = list(range(self._next_id, self._next_id + len(found.parts)))
        self.record(Decision("split", rnd, cluster.id, children, found.parts,
                             {"rule": "recluster", **found.figures, "test": cosines.looks,
                              "cluster_size": len(cluster.members)},
                             (found.clients, found.similarity)))
        self._split(cluster, children)
        return found.parts

    def thresholds(self) -> list[dict[str, Any]]:
        if not self.params.recheck:
            return []
        return [{"statistic": SCORE_FIGURE[self.params.split_statistic],
                 "value": self.params.f_threshold,
                 "label": "split threshold"}]

    # -- the merge test (algorithms.merging) --------------------------------------------------
    def probe_ready(self, cluster: Cluster) -> bool:
        return self.clustered_round is not None and super().probe_ready(cluster)

    def merged(self, kept: Cluster, absorbed: Cluster) -> None:
        super().merged(kept, absorbed)
        for cluster in (kept, absorbed):  # the kept one's pairs were computed at its old model
            self.coround.pop(cluster.id, None)
        self.children[absorbed.id] = [kept.id]  # clients waiting among its heirs now get kept

    def left(self, cluster: Cluster, client: int) -> None:
        super().left(cluster, client)
        self.coround.pop(cluster.id, None)  # its pair sums hold the member that left

    # -- clients never seen before clustering --------------------------------------------------
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
        offered = self._offer(self._unplaced[client])
        self._offered[client] = [c.id for c in offered]
        return Select(client, rnd, self._stack_of(offered), criterion="accuracy", train=train)

    def final_tasks(self, rnd: int, clients: list[int]) -> list[Task]:
        """Placed on their scores alone: after the last round no update would be aggregated
        (training them would cost a local training and a full update per client: 22 GB for
        the 70,000 clients still unplaced at the end of the 100,000-client benchmark)."""
        return [self.placement_task(rnd, c, train=False) for c in clients if c in self._unplaced]

    def _offer(self, key: int) -> list[Cluster]:
        """The clusters a waiting client may join: those descending from the cluster it was a
        member of when a later split left it out (it stays among its cluster's heirs, so a
        client cannot use its placement to leave its community, e.g. an attacker choosing the
        benign model), or any cluster for a client never seen before clustering."""
        if key not in self.children:
            return list(self._clusters)
        heirs, todo = set(), list(self.children[key])
        while todo:
            node = todo.pop()
            if node in self.children:
                todo.extend(self.children[node])
            else:
                heirs.add(node)
        return [c for c in self._clusters if c.id in heirs]

    def place(self, reply: Reply) -> tuple[Cluster | None, bool]:
        offered = self._offered.pop(reply.client, [])
        if reply.choice is None or not 0 <= reply.choice < len(offered):
            return None, False
        chosen = next(c for c in self._clusters if c.id == offered[reply.choice])
        return chosen, True

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {
            "store": self.store.state_dict(), "changes": self.stability.changes,
            "clustered_round": self.clustered_round, "trained_rounds": self.trained_rounds,
            "groups_score": self.groups_score, "most_replies": self.most_replies,
            "recent_cuts": list(self._recent_cuts), "group_cuts": self.group_cuts,
            "children": self.children,
            "watches": self.watches.state_dict(),
            "coround": {k: v.state_dict() for k, v in self.coround.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.store = IncrementalSimilarity.from_state(state["store"])
        self.stability.changes = list(state["changes"])
        self.clustered_round = state["clustered_round"]
        self.groups_score = state.get("groups_score")
        self._recent_cuts = deque(state.get("recent_cuts", []), maxlen=self.params.patience)
        self.group_cuts = state.get("group_cuts", [])
        self.most_replies = state.get("most_replies", 0)
        self.trained_rounds = {int(k): v for k, v in state.get("trained_rounds", {}).items()}
        self.children = {int(k): list(v) for k, v in state.get("children", {}).items()}
        self.watches.load_state_dict(state.get("watches", {}))
        self.coround = {int(k): SameRoundCosines.from_state(v)
                        for k, v in state.get("coround", {}).items()}
