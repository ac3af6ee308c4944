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
none from rounds 12 to 24, then 1.4-1.7). Before the model settles, a round of at least
`round_window` replies (off by default) is a window on its own too, whatever share of the
members they are: the share rule asks a large cluster sampled at a few percent for far more
replies than one round brings, though a window's power depends on its count of updates, not
on its share. On the grid's seed 3 (`mnist-feature_skew-g5-n228`, 25 replies a round of 228;
`-g5-n298`, 21 of 298) one round's replies scored 2.6-28 in the first 15 rounds (14 and 13 of
15 above 5), while the windows spanning rounds after settling scored 1.6-3.8 and neither
method split off the invert group; the cells' IID twins scored 1.04-1.73 on every round.
Applied after settling as well (a trial), one-round windows of 16 replies replaced the
spanning windows that find `mnist5k-rotation-g5-n235` (16 replies a round, 5 groups: ARI 1.0
-> 0.0 for both methods, seed 0). Each closed
window is scored by a pseudo-F of its cosine matrix's min-max merge tree (about 1 for
structureless updates, large when parts point apart, see `split_stats`; the algorithm says
which cut it scores). Above `f_threshold` in `patience` windows in a row (or in `votes` of the
last `patience`, the latest among them), fresh evidence each time, the cluster holds groups and
should split. No extra communication, no scale or round
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


def split_vote(scores: list[float], threshold: float, patience: int, votes: int | None = None
               ) -> bool:
    """The split rule on a cluster's window statistics so far, latest last: the latest above
    `threshold`, and `votes` of the last `patience` (default: all of them)."""
    recent = scores[-patience:]
    above = sum(s > threshold for s in recent)
    return scores[-1] > threshold and above >= (votes or patience)


@dataclass
class Examination:
    window: Window
    stats: SplitStats


@dataclass
class SplitWatch:
    stability: Stabilisation
    coverage: float
    min_size: int
    same_round_share: float | None = None
    round_window: int | None = None
    window: UpdateWindow = field(default_factory=UpdateWindow)
    scores: list[float] = field(default_factory=list)  # each closed window's statistic

    def needed(self, members: int) -> int:
        return min(members, MAX_WINDOW,
                   max(self.min_size, math.ceil(self.coverage * members)))

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
        needed = self.needed(len(members))
        if not may_span and self.same_round_share is not None:  # this round's replies alone
            needed = min(needed, max(self.min_size, math.ceil(self.same_round_share * needed)))
        if (not may_span and self.round_window is not None
                and len(clients) >= max(self.min_size, self.round_window)):
            needed = min(needed, len(clients))  # enough replies of one model: a window alone
        window = self.window.add(clients, updates, examples, needed, may_span=may_span)
        if window is None:
            return None
        return Examination(window, split_stats(window.gram.numpy(), window.examples,
                                               window.similarity, linkage))

    def fires(self, score: float, threshold: float, votes: int | None = None) -> bool:
        """Count one window's statistic; True when it is above `threshold` and so are `votes`
        of the last `patience` windows (default: all of them, i.e. `patience` in a row). The
        latest window must be one of them: its cut is the one a split makes."""
        self.scores.append(score)
        return split_vote(self.scores, threshold, self.stability.patience, votes)

    def state_dict(self) -> dict[str, Any]:
        return {"changes": list(self.stability.changes), "last": self.stability.last,
                "scores": list(self.scores), "window": self.window.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stability.changes = list(state["changes"])
        self.stability.last = state["last"]
        self.scores = list(state["scores"] if "scores" in state else state["pseudo_f"])
        self.window = UpdateWindow.from_state(state["window"])


class SplitWatches:
    """One `SplitWatch` per cluster, made on first use and checkpointed together: what CFL and
    incremental clustering's re-examination keep between rounds."""

    def __init__(self, patience: int, tol: float, coverage: float, min_size: int,
                 same_round_share: float | None = None, round_window: int | None = None
                 ) -> None:
        self.patience, self.tol, self.coverage, self.min_size = patience, tol, coverage, min_size
        self.same_round_share, self.round_window = same_round_share, round_window
        self.watches: dict[int, SplitWatch] = {}

    def __getitem__(self, cluster_id: int) -> SplitWatch:
        if cluster_id not in self.watches:
            self.watches[cluster_id] = SplitWatch(Stabilisation(self.patience, self.tol),
                                                  self.coverage, self.min_size,
                                                  self.same_round_share, self.round_window)
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
