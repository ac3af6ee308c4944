"""Keep examining a cluster: CFL's scale-free split test on what its members already send.

Each round the cluster is trained, its members' updates go into a window (`UpdateWindow`) that
closes as soon as it holds updates of `coverage` of the members (at least `min_size`): one round
under full participation (then this is exactly CFL's same-round test), the fewest rounds that
reach the coverage otherwise, and those only once the cluster's own model has settled
(`Stabilisation`), so that the updates of a window differ by data more than by age. Before
that, one round's replies still form a window on their own when they number at least
`same_round_share` of what a window needs: they were all computed at one model, so they
differ by data, not age (the CFL paper's same-round updates). Without it a cluster sampled at
less than `coverage` a round got no window until its model settled, and the early rounds,
where groups pull apart most, went unexamined (on the grid, seed 0, CFL then never split off
feature_skew's invert group of `mnist-feature_skew-g5-n184`: windows of 41 and 31 in warm-up,
none from rounds 12 to 24, then 1.4-1.7). Each closed
window is scored by a pseudo-F of its cosine matrix's min-max merge tree (about 1 for
structureless updates, large when parts point apart, see `split_stats`; the algorithm says
which cut it scores). Above `f_threshold` in `patience` windows in a row, fresh evidence each
time, the cluster holds groups and should split. No extra communication, no scale or round
number in the decision.
A window never holds more than `MAX_WINDOW` updates: when more members reply in one round, an
evenly spread subset of them (by client id) is taken.
A round with a single reply adds nothing to a window (nor drops one): a lone update shows no
disagreement at the model it was computed at, and with one reply a round the cluster model is
the last client's own model, so the next update measures how far that client's optimum lies
from the previous one's — a property of the pair, not of the client. (MNIST, 100 clients in 4
groups, one sampled a round: a window of 50 such updates scored 6.1 on a 25-part cut of pairs
and singletons, three windows in a row, and CFL split into 25 clusters.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedflock.clustering.split_stats import SplitStats, split_stats
from fedflock.clustering.stability import Stabilisation
from fedflock.clustering.window import UpdateWindow, Window
from fedflock.wire import Reply

# The most updates a window holds: its pseudo-F has long settled at this many, while its memory
# (one full update each) and Gram matrix would keep growing with a cluster of 100,000 members.
MAX_WINDOW = 1000


@dataclass(frozen=True)
class WindowRule:
    """When a cluster's window closes and how many windows above the threshold split it."""

    patience: int  # windows in a row above the threshold; also the rounds of `Stabilisation`
    stable_tol: float  # a window may span rounds once the model's change shrank by less
    coverage: float  # share of the members whose updates a window needs
    min_size: int  # and at least this many
    same_round_share: float | None  # before settling, one round is a window at this share


@dataclass
class Examination:
    window: Window
    stats: SplitStats


@dataclass
class SplitWatch:
    rule: WindowRule
    stability: Stabilisation = field(init=False)
    window: UpdateWindow = field(default_factory=UpdateWindow)
    scores: list[float] = field(default_factory=list)  # each closed window's statistic

    def __post_init__(self) -> None:
        self.stability = Stabilisation(self.rule.patience, self.rule.stable_tol)

    def needed(self, members: int) -> int:
        rule = self.rule
        return min(members, MAX_WINDOW, max(rule.min_size, math.ceil(rule.coverage * members)))

    def examine(self, members: list[int], model: torch.Tensor, clients: list[int],
                updates: torch.Tensor, examples: list[int], linkage: str = "single"
                ) -> Examination | None:
        """Take this round's updates of replying `clients`, computed at `model`; the
        statistics of the window when it closes (None while it is open)."""
        self.stability.observe(model)
        if len(clients) > MAX_WINDOW:  # more replies than a window holds: an even subset
            keep = np.linspace(0, len(clients) - 1, MAX_WINDOW).round().astype(int).tolist()
            clients, updates = [clients[i] for i in keep], updates[keep]
            examples = [examples[i] for i in keep]
        if len(clients) < 2:
            return None  # one update shows no disagreement at its model (see the module doc)
        # a window begun while the model was settled runs to its end (the relative change of
        # a partially sampled cluster is noisy: re-testing each round would drop most windows)
        may_span = len(self.window) > 0 or self.stability.stable()
        needed, share = self.needed(len(members)), self.rule.same_round_share
        if not may_span and share is not None:  # this round's replies alone
            needed = min(needed, max(self.rule.min_size, math.ceil(share * needed)))
        window = self.window.add(clients, updates, examples, needed, may_span=may_span)
        if window is None:
            return None
        return Examination(window, split_stats(window.gram.numpy(), window.examples,
                                               window.similarity, linkage))

    def fires(self, score: float, threshold: float) -> bool:
        """Count one window's statistic; True when it and the `patience - 1` before it are
        above `threshold`."""
        self.scores.append(score)
        recent = self.scores[-self.rule.patience:]
        return len(recent) == self.rule.patience and all(s > threshold for s in recent)

    def state_dict(self) -> dict[str, Any]:
        return {"changes": list(self.stability.changes), "last": self.stability.last,
                "scores": list(self.scores), "window": self.window.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stability.changes = list(state["changes"])
        self.stability.last = state["last"]
        self.scores = list(state["scores"])
        self.window = UpdateWindow.from_state(state["window"])


class SplitWatches:
    """One `SplitWatch` per cluster, made on first use and checkpointed together: what CFL and
    incremental clustering's re-examination keep between rounds."""

    def __init__(self, rule: WindowRule) -> None:
        self.rule = rule
        self.watches: dict[int, SplitWatch] = {}

    def __getitem__(self, cluster_id: int) -> SplitWatch:
        if cluster_id not in self.watches:
            self.watches[cluster_id] = SplitWatch(self.rule)
        return self.watches[cluster_id]

    def examine(self, cluster_id: int, members: list[int], model: torch.Tensor,
                replies: list[Reply], width: int, linkage: str = "single"
                ) -> Examination | None:
        """`SplitWatch.examine` on the replies' updates (their first `width` entries)."""
        return self[cluster_id].examine(
            members, model[:width], [r.client for r in replies],
            torch.stack([r.update[:width] for r in replies]),
            [r.num_examples for r in replies], linkage)

    def drop(self, cluster_id: int) -> None:
        """Forget a cluster that split (its heirs start afresh)."""
        self.watches.pop(cluster_id, None)

    def state_dict(self) -> dict[int, dict[str, Any]]:
        return {k: w.state_dict() for k, w in self.watches.items()}

    def load_state_dict(self, state: dict[Any, dict[str, Any]]) -> None:
        self.watches = {}
        for key, watch in state.items():
            self[int(key)].load_state_dict(watch)
