"""Undo a split that found no groups: the split test asked again, at one model.

Two clusters' own updates cannot say whether they hold one group: near its own model each cluster's
updates are noise around zero either way. At one model they can. Some sampled members of cluster A
also train cluster B's model, beside their own (probes: side tasks, so a cluster's training loses
nothing to them); beside the updates B's own members computed at the same model, the split test's
pseudo-F of the cut {A's probes | B's updates} is about 1 when A and B hold one group and large
when they point apart (measured with `benchmarks/merge_probe.py` on the grid's default runs: one
group 0.9-3.1, two groups 5.05 and up; README *Scenario grid*). The pair merges once its last
`patience` windows (at least 2), of both directions (A's probes at B's model, B's at A's) and each
direction among them, scored at most the split bar; it is settled apart, and no longer probed, once
its last `patience` windows all scored above it, or after `GIVE_UP` times `patience` windows
without a merge (scores that straddle the bar would otherwise keep it probing for ever). The bar is
the split test's own: a merge undoes what that test would not have done.

A window of one direction collects probes and own updates, one per client (a later one replaces
an earlier), and closes when each side holds `min_side` clients, or all of a smaller cluster's
(at least 3: a pseudo-F needs a scatter within each side); with fewer probes the two groups'
scores come down towards the bar (4.0 at 6 a side mid-run, 7.7 at 12; on the grid, windows of 6
merged feature_skew's invert group back, windows of 12 did not), which `patience` windows in
both directions also guard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedflock.clustering.split_stats import pseudo_f
from fedflock.similarity import cosine_from_gram, gram_matrix

MIN_SIDE = 3  # the fewest clients a side of a probe window can hold
GIVE_UP = 3  # windows, in multiples of `patience`, after which an undecided pair is left apart


@dataclass
class ProbeWindow:
    """One direction of a pair: probes of the prober's members at the host's model."""

    probes: dict[int, torch.Tensor] = field(default_factory=dict)
    own: dict[int, torch.Tensor] = field(default_factory=dict)

    def add(self, probes: dict[int, torch.Tensor], own: dict[int, torch.Tensor],
            min_side: int) -> float | None:
        """Add one round's updates at the host's model; the closed window's score, if any."""
        self.probes.update({c: u.clone() for c, u in probes.items()})  # not views of a
        self.own.update({c: u.clone() for c, u in own.items()})  # round's (k, P) replies
        if min(len(self.probes), len(self.own)) < min_side:
            return None
        updates = torch.stack([*self.probes.values(), *self.own.values()])
        similarity = cosine_from_gram(gram_matrix(updates)).numpy().astype(np.float64)
        n = len(self.probes)
        self.probes, self.own = {}, {}
        return pseudo_f(similarity, (list(range(n)), list(range(n, len(updates)))))


class MergeTests:
    """The probe windows of every pair under test, and the pairs settled apart."""

    def __init__(self, patience: int, threshold: float, min_side: int) -> None:
        self.patience, self.threshold, self.min_side = patience, threshold, min_side
        self.windows: dict[tuple[int, int], ProbeWindow] = {}  # (prober, host)
        self.scores: dict[frozenset[int], list[tuple[int, float]]] = {}  # pair -> (host, score)
        self.apart: set[frozenset[int]] = set()

    def needed(self, prober_size: int, host_size: int) -> int | None:
        """Clients each side of a window needs (None: a cluster too small to test)."""
        smaller = min(prober_size, host_size)
        return None if smaller < MIN_SIDE else min(self.min_side, smaller)

    def probers(self, prober: int, host: int, sampled: list[int], needed: int) -> list[int]:
        """Which of the prober cluster's sampled members probe the host's model this round:
        as many as its open window lacks, members it does not hold yet first."""
        window = self.windows.get((prober, host))
        held = window.probes.keys() if window is not None else set()
        lacking = max(needed - len(held), 0)
        fresh = [c for c in sampled if c not in held]
        return fresh[:lacking]

    def add(self, prober: int, host: int, probes: dict[int, torch.Tensor],
            own: dict[int, torch.Tensor], needed: int) -> float | None:
        score = self.windows.setdefault((prober, host), ProbeWindow()).add(probes, own, needed)
        if score is not None:
            self.scores.setdefault(frozenset((prober, host)), []).append((host, score))
        return score

    def verdict(self, a: int, b: int) -> str | None:
        """'merge', 'apart' (recorded: the pair is no longer probed) or None (not yet)."""
        pair = frozenset((a, b))
        scores = self.scores.get(pair, [])
        both = scores[-max(self.patience, 2):]  # a merge needs both models among them
        if len(both) == max(self.patience, 2) and {host for host, _ in both} == {a, b} \
                and all(score <= self.threshold for _, score in both):
            return "merge"
        recent = scores[-self.patience:]
        if (len(recent) == self.patience and all(s > self.threshold for _, s in recent)) \
                or len(scores) >= GIVE_UP * self.patience:
            self.apart.add(pair)
            return "apart"
        return None

    def last(self, a: int, b: int) -> dict[int, float]:
        """The latest score at each cluster's model (host -> score)."""
        return dict(self.scores.get(frozenset((a, b)), []))

    def forget(self, cluster: int) -> None:
        """Drop every window involving a cluster that split or merged."""
        self.windows = {k: w for k, w in self.windows.items() if cluster not in k}
        self.scores = {k: v for k, v in self.scores.items() if cluster not in k}

    def state_dict(self) -> dict[str, Any]:
        return {"windows": {f"{a},{b}": vars(w) for (a, b), w in self.windows.items()},
                "scores": {",".join(map(str, sorted(k))): v for k, v in self.scores.items()},
                "apart": [sorted(p) for p in self.apart]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.windows = {}
        for key, window in state.get("windows", {}).items():
            a, b = (int(x) for x in key.split(","))
            self.windows[a, b] = ProbeWindow({int(c): u for c, u in window["probes"].items()},
                                             {int(c): u for c, u in window["own"].items()})
        self.scores = {frozenset(int(x) for x in key.split(",")): [(int(h), float(v))
                                                                   for h, v in scores]
                       for key, scores in state.get("scores", {}).items()}
        self.apart = {frozenset(int(x) for x in p) for p in state.get("apart", [])}
