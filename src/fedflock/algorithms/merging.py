"""Clusters that can be merged again: the merge test (`clustering.merge`), shared by the methods
whose split test may cut one group (CFL, incremental clustering).

With `merge_test` on, clusters whose models are each other's nearest (Euclidean) among those ready
for it (`probe_ready`: their own models have settled) are paired, both directions at once; a
cluster whose nearest is taken waits. As many of a paired cluster's sampled members as the pair's
open window still lacks (members it does not hold yet first) also train the partner's model, beside
their own: a probe, sent as a side task in the same message (`Algorithm.side_tasks`) and aggregated
nowhere, so a cluster's training loses nothing and a run is the run without the test until its
first merge (without differential privacy: under it the clients' noise is calibrated from round 1
for the probes' releases too). The price: those clients train and upload twice that round, and
under differential privacy every client is accounted a second release a round (an upper bound). A
pair the test finds one group merges: the larger cluster absorbs the smaller, its model the two
models' member-weighted mean (each was the FedAvg of its own members), recorded in `splits` as
`kind: merge` with the latest window's score at each model. A departure from both papers, which
never merge.

Not under attack: members of an attacker cluster probed at the nearest benign model could behave
for a few windows and be merged into it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from pydantic import BaseModel

from fedflock.algorithms.base import AlgorithmContext, Cluster, Decision
from fedflock.algorithms.reselection import ReselectingAlgorithm
from fedflock.clustering.merge import MergeTests
from fedflock.clustering.watch import SplitWatches
from fedflock.wire import Reply, Task


class MergingAlgorithm(ReselectingAlgorithm):
    """A clustered algorithm with the merge test (its params: `SplitTestParams`; its split
    test's windows: `watches`, built by the subclass)."""

    watches: SplitWatches

    def __init__(self, params: Any, context: AlgorithmContext) -> None:
        super().__init__(params, context)
        p = self.params
        self.merges = MergeTests(p.patience, p.f_threshold, p.merge_min_probes)
        self._pairs: list[tuple[int, int]] = []  # this round's (prober, host) under test
        self._probing: dict[int, tuple[int, int]] = {}  # client -> (its cluster, host cluster)
        self._probes: list[Reply] = []  # this round's probe replies (`receive_side`)

    # -- what a subclass says --------------------------------------------------------------
    def probe_ready(self, cluster: Cluster) -> bool:
        """Whether a cluster may be tested: once its own model has settled (`settled`). Right
        after a split both models still move on from their parent's, and probes at a moving
        model see mostly that shared step: on the grid (seed 0) the invert group CFL had split
        off a feature_skew cell scored 2.9-3.4 against the rest five rounds later, and merged
        back."""
        return self.settled(cluster)

    def settled(self, cluster: Cluster) -> bool:
        """Whether a cluster's own model has settled, by the test that lets its split windows
        span rounds (`stable_tol`, on its own rounds)."""
        watch = self.watches.watches.get(cluster.id)
        return watch is not None and watch.stability.stable()

    def merged(self, kept: Cluster, absorbed: Cluster) -> None:
        """After `absorbed` joined `kept`: both clusters' split windows start afresh."""
        for cluster in (kept, absorbed):
            self.watches.drop(cluster.id)

    def left(self, cluster: Cluster, client: int) -> None:
        """A member that moved away leaves its cluster's open split window."""
        watch = self.watches.watches.get(cluster.id)
        if watch is not None:
            watch.window.forget(client)

    def probe_task(self, rnd: int, client: int, params: torch.Tensor) -> Task:
        """A member's training at the partner's model, as its own training task but with
        randomness of its own (`Train.probe`)."""
        return dataclasses.replace(self.train_task(rnd, client, params), probe=True)

    @classmethod
    def releases(cls, params: BaseModel, rounds: int) -> int:
        """A probe is a second update a client may release in a round."""
        base = super().releases(params, rounds)
        return base + rounds if params.merge_test else base

    def current(self, cluster_id: int) -> int:
        """The cluster a (possibly absorbed) cluster's members now belong to."""
        absorbed = self.merged_into()
        while cluster_id in absorbed:
            cluster_id = absorbed[cluster_id]
        return cluster_id

    # -- probes --------------------------------------------------------------------------
    def _partners(self) -> dict[int, Cluster]:
        """Pairs under test: clusters whose models are each other's nearest among those that
        can be tested together (both `probe_ready`, both large enough for a window, not found
        apart). Mutual, so both directions of a pair are probed; a cluster whose nearest is
        taken waits until that pair is decided."""
        ready = [c for c in self._clusters if self.probe_ready(c)]
        if len(ready) < 2:
            return {}
        models = torch.stack([c.params[: self.update_size] for c in ready]).double()
        distance = torch.cdist(models, models)
        for i, a in enumerate(ready):
            for j, b in enumerate(ready):
                if i == j or frozenset((a.id, b.id)) in self.merges.apart or \
                        self.merges.needed(len(a.members), len(b.members)) is None:
                    distance[i, j] = math.inf
        nearest = distance.argmin(dim=1).tolist()
        return {a.id: ready[j] for i, (a, j) in enumerate(zip(ready, nearest, strict=True))
                if math.isfinite(distance[i, j]) and nearest[j] == i}

    def side_tasks(self, rnd: int, tasks: list[Task]) -> list[Task]:
        """Probes: sampled members of a cluster under test, besides training their own model,
        train the partner's, as many as the pair's open window still lacks (members not yet
        in it first)."""
        self._pairs, self._probing, self._probes = [], {}, []
        if not self.params.merge_test:
            return []
        partners = self._partners()
        self._pairs = sorted((a, b.id) for a, b in partners.items())
        sampled: dict[int, list[int]] = {}  # cluster under test -> its members with a task
        for task in tasks:
            cluster = None if task.client in self._unplaced else \
                self._cluster_of.get(task.client)
            if cluster is not None and cluster.id in partners:
                sampled.setdefault(cluster.id, []).append(task.client)
        sizes = {c.id: len(c.members) for c in self._clusters}
        out: list[Task] = []
        for cluster_id, clients in sorted(sampled.items()):
            partner = partners[cluster_id]
            needed = self.merges.needed(sizes[cluster_id], sizes[partner.id])
            assert needed is not None  # `_partners` pairs only clusters large enough
            for client in self.merges.probers(cluster_id, partner.id, clients, needed):
                self._probing[client] = (cluster_id, partner.id)
                out.append(self.probe_task(rnd, client, partner.params))
        return out

    def receive_side(self, rnd: int, replies: list[Reply]) -> None:
        self._probes = list(replies)

    # -- each round: train, then test --------------------------------------------------------
    def aggregate_train(self, rnd: int, replies: list[Reply]) -> dict[str, Any]:
        probes, self._probes = self._probes, []
        hosts = {host for _, host in self._pairs}
        own: dict[int, dict[int, torch.Tensor]] = {}  # host -> its members' own updates
        for r in replies:
            cluster = self._cluster_of.get(r.client)  # (none for a client placed now)
            if cluster is not None and cluster.id in hosts:
                own.setdefault(cluster.id, {})[r.client] = r.update[: self.update_size]
        before = {c.id for c in self._clusters}
        out = super().aggregate_train(rnd, replies)
        for gone in before - {c.id for c in self._clusters}:  # split this round
            self.merges.forget(gone)
        if self._pairs:
            self._test_merges(rnd, probes, own, out)
        return out

    def _test_merges(self, rnd: int, probes: list[Reply],
                     own: dict[int, dict[int, torch.Tensor]], out: dict[str, Any]) -> None:
        """Add this round's probes, and the hosts' own updates (whether or not a probe came
        this round), to the windows of the pairs under test; merge a pair the test finds one
        group."""
        sizes = {c.id: len(c.members) for c in self._clusters}
        by_pair: dict[tuple[int, int], dict[int, torch.Tensor]] = {}
        for r in probes:
            by_pair.setdefault(self._probing[r.client], {})[r.client] = r.update[
                : self.update_size]
        log = []
        for prober, host in self._pairs:
            updates = by_pair.get((prober, host), {})
            if not {prober, host} <= sizes.keys():
                continue  # one of them split or merged this round
            if not updates and not own.get(host):
                continue
            needed = self.merges.needed(sizes[prober], sizes[host])
            assert needed is not None  # `_partners` pairs only clusters large enough; they grow
            score = self.merges.add(prober, host, updates, own.get(host, {}), needed)
            if score is not None:
                log.append({"prober": prober, "host": host, "score": round(score, 4)})
            if self.merges.verdict(prober, host) == "merge":
                self._merge(rnd, prober, host)
                sizes = {c.id: len(c.members) for c in self._clusters}
        if log:
            out["merge_test"] = log

    def _merge(self, rnd: int, a: int, b: int) -> None:
        """The larger of clusters a and b absorbs the other; its model becomes the two models'
        mean weighted by members (each was FedAvg of its own)."""
        first, second = (next(c for c in self._clusters if c.id == i) for i in (a, b))
        kept, absorbed = sorted((first, second), key=lambda c: (-len(c.members), c.id))
        size = len(kept.members) + len(absorbed.members)
        kept.params = (kept.params * len(kept.members)
                       + absorbed.params * len(absorbed.members)) / size
        kept.members = sorted(kept.members + absorbed.members)
        self._clusters = [c for c in self._clusters if c is not absorbed]
        last = self.merges.last(a, b)  # the latest window's score at each model
        scores = {"score_at_kept": round(last[kept.id], 4),
                  "score_at_absorbed": round(last[absorbed.id], 4)}
        for cluster_id in (a, b):
            self.merges.forget(cluster_id)
        self.merged(kept, absorbed)
        self._index_members()
        self.record(Decision("merge", rnd, [a, b], [kept.id], [kept.members],
                             {"rule": "merge test", **scores}))

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"merges": self.merges.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.merges.load_state_dict(state.get("merges", {}))
