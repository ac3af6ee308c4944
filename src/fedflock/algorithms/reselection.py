"""Members that can change cluster: re-selection, shared by CFL and incremental clustering.

A split or a Louvain community can put a client with the wrong group: incremental clustering's
communities are found on stale updates (on the scenario grid, seeds 1 and 2, three
brightness/contrast clients of `mnist-feature_skew-g5-n184` sat with the invert group to the
end; on seed 1 at 0-18% accuracy), and the cluster's split test never cut the two or three
intruders off.

With `reselect` on, once at least two clusters have settled (their own models' change stopped
shrinking: the test that lets split windows span rounds), a sampled member of a settled cluster
scores the settled cluster models on its own training data (a `Select` task, its own model
first, criterion accuracy) and trains the one it chooses: its own, unless another is clearly
more accurate (`tasks.clearly_better`: Fisher's exact test at `reselect_level`, so two about
equally good models, e.g. of congruent groups, never trade members). Each member does this
once per set of settled clusters, the first time it is sampled after that set changed (a
split, a merge, a cluster settling). Models still learning are neither left nor joined: right
after a CFL split a young cluster's model is near chance for its own group, and its members
moved to whichever older model happened to fit better (on the grid, seed 0, without this
condition CFL's ARI on `mnist-label_permutation-g8-n121` fell from 1.00 to 0.66, 94.2 -> 72.7%).
A member that chose another cluster moves only if both hold:
- it is *misplaced*: its cluster's model serves it clearly worse (the same test) than it serves
  the median of its other members, by what they reported at their own last re-selection (at
  least two of them). A cluster whose model serves none of its members is not left: such are
  the communities of model-poisoning attackers, whose own model diverged, and who find the
  benign model clearly better exactly as an intruder finds its group's;
- its update, computed at the chosen cluster's model, agrees with the updates that cluster's
  own members computed at the same model in the same round at least as well as the median
  member does (cosine with their mean, against each member's with the mean of the others; and
  positive): a client of that group sends one more such update, a sign-flipping attacker's
  opposes them, a zero update has no direction. Fewer than two members replying: refused.
Under `configs/mnist_attack_sign_flip.yaml` at 60% colluding attackers (seed 0) a first version
that admitted any update pointing along the chosen cluster's last step let 16 attackers into
the benign cluster (benign accuracy 95.8% -> 56.1%); with the agreement test alone, 4 were
admitted in a round where the two benign members' updates at the converged model were nearly
orthogonal (median 0.006, the attackers' 0.063; 76.7%); with both tests none (95.8%).
An admitted member moves with its update (recorded in `splits` as `kind: move`, with both
accuracies, its cosine and the members' median); a refused one stays, its update (computed at
another model) is dropped, and it may choose again the next time it is sampled.

Cost: at each re-selection the member downloads every settled cluster model, not one, and
evaluates each on its training data (a forward pass; its training is unchanged); uploads grow by
two numbers per model. A departure from both papers, whose cluster memberships change only by
splits; IFCA re-selects every round, by loss and without a test.

Under model poisoning these two tests are what keep attackers out: an attacker training on
benign data finds the benign model most accurate and asks to move, every time it is sampled.
An adaptive attacker (one that reports false scores, or behaves during its admission round and
attacks afterwards) is not stopped by them, as it would not be by Louvain's communities.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

from fedflock.algorithms.base import AlgorithmContext, Cluster, Decision
from fedflock.algorithms.clustered import ClusteredAlgorithm
from fedflock.client.tasks import Select, Train, clearly_better
from fedflock.wire import Reply, Task


class ReselectingAlgorithm(ClusteredAlgorithm):
    """A clustered algorithm whose members may move (params: `SplitTestParams`)."""

    params: BaseModel

    def __init__(self, params: Any, context: AlgorithmContext) -> None:
        super().__init__(params, context)
        self._offers: dict[int, list[int]] = {}  # client -> cluster ids offered, own first
        self._reselected: dict[int, tuple[int, ...]] = {}  # client -> the settled clusters
        # it chose among last (it chooses again only when they have changed)
        self._served: dict[int, tuple[int, float]] = {}  # client -> (its cluster, the training
        # accuracy of that cluster's model it reported at its last re-selection)
        self._stacks: dict[tuple[int, ...], tuple[list[torch.Tensor], torch.Tensor]] = {}

    # -- what a subclass says --------------------------------------------------------------
    def reselecting(self) -> bool:
        """Whether members re-select now (subclasses add conditions)."""
        return bool(self.params.reselect) and len(self._clusters) > 1

    def settled(self, cluster: Cluster) -> bool:
        """Whether a cluster's model has settled enough to be left or joined (default: yes)."""
        return True

    def left(self, cluster: Cluster, client: int) -> None:
        """After `client` left `cluster`: forget what the cluster kept of it."""

    # -- tasks -----------------------------------------------------------------------------
    def configure_train(self, rnd: int, clients: list[int]) -> list[Task]:
        tasks = super().configure_train(rnd, clients)
        self._offers = {}
        if not self.reselecting():
            return tasks
        settled = [c for c in self._clusters if self.settled(c)]
        if len(settled) < 2:
            return tasks
        key = tuple(c.id for c in settled)
        return [self._reselect_task(t, settled, key) if type(t) is Train
                and t.client not in self._unplaced and self._cluster_of[t.client].id in key
                and self._reselected.get(t.client) != key else t for t in tasks]

    def _reselect_task(self, task: Train, settled: list[Cluster], key: tuple[int, ...]
                       ) -> Task:
        own = self._cluster_of[task.client]
        offered = [own] + [c for c in settled if c is not own]
        self._offers[task.client] = [c.id for c in offered]
        self._reselected[task.client] = key
        return Select(task.client, task.round, self._stack_of(offered), criterion="accuracy",
                      keep_level=self.params.reselect_level)

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

    # -- moves -----------------------------------------------------------------------------
    def aggregate_train(self, rnd: int, replies: list[Reply]) -> dict[str, Any]:
        offers, self._offers = self._offers, {}
        if not offers:  # (re-selection off, or no member asked this round)
            return super().aggregate_train(rnd, replies)
        for r in replies:  # what each re-selecting member's own cluster model scored
            if offers.get(r.client):
                self._served[r.client] = (offers[r.client][0], float(r.tensors["scores"][0, 0]))
        movers = {r.client: offers[r.client][r.choice] for r in replies
                  if offers.get(r.client) and r.choice}
        if not movers:
            return super().aggregate_train(rnd, replies)
        stayed: dict[int, list[torch.Tensor]] = {}  # cluster -> updates at its model this round
        for r in replies:  # (its members' who trained it: movers and newcomers excluded)
            if r.client not in movers and r.client in self._cluster_of:
                stayed.setdefault(self._cluster_of[r.client].id, []).append(
                    r.update[: self.update_size])
        kept, moves, refused = [], 0, 0
        for r in replies:
            if r.client not in movers:
                kept.append(r)
            elif self._move(rnd, r, movers[r.client], stayed.get(movers[r.client], [])):
                kept.append(r)
                moves += 1
            else:  # it may choose again the next time it is sampled
                refused += 1
                self._reselected.pop(r.client, None)
        out = super().aggregate_train(rnd, kept)
        if moves or refused:
            out.update(moves=moves, refused_moves=refused)
        return out

    def _misplaced(self, reply: Reply, cluster: Cluster) -> bool:
        """Whether the cluster's model serves the replying member clearly worse than it serves
        the median of its other members (their reports at their last re-selection, at least
        two): a misplaced client in a cluster that works. A cluster whose model serves none of
        its members (attackers whose own model diverged, one still learning) is not left."""
        mates = [self._served[c][1] for c in cluster.members
                 if c != reply.client and self._served.get(c, (None,))[0] == cluster.id]
        if len(mates) < 2:
            return False
        own = float(reply.tensors["scores"][0, 0])
        return clearly_better(own, float(np.median(mates)), reply.num_examples,
                              self.params.reselect_level)

    def _move(self, rnd: int, reply: Reply, target_id: int, members: list[torch.Tensor]
              ) -> bool:
        """Move the replying member to the cluster it chose if its own cluster serves its other
        members clearly better than it (`misplaced`), and its update agrees with the updates
        the chosen cluster's members computed at the same model this round at least as well as
        the median member does (`admission`)."""
        source = self._cluster_of[reply.client]
        if not self._misplaced(reply, source):
            return False
        agreement = admission(reply.update[: self.update_size], members)
        if agreement is None:
            return False
        cosine, bar = agreement
        if cosine <= max(bar, 0.0):
            return False
        target = next(c for c in self._clusters if c.id == target_id)
        source.members.remove(reply.client)
        target.members.append(reply.client)
        self._cluster_of[reply.client] = target
        self.left(source, reply.client)
        scores = reply.tensors["scores"]
        self.record(Decision("move", rnd, source.id, [target.id], [[reply.client]],
                             {"rule": "reselect", "accuracy_own": round(float(scores[0, 0]), 4),
                              "accuracy_chosen": round(float(scores[reply.choice, 0]), 4),
                              "cosine_to_members": round(cosine, 4),
                              "members_median": round(bar, 4),
                              "members_replied": len(members)}))
        return True

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {
            "reselected": {c: list(k) for c, k in self._reselected.items()},
            "served": {c: list(v) for c, v in self._served.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._reselected = {int(c): tuple(k) for c, k in state.get("reselected", {}).items()}
        self._served = {int(c): (int(v[0]), float(v[1]))
                        for c, v in state.get("served", {}).items()}


def admission(update: torch.Tensor, members: list[torch.Tensor]
              ) -> tuple[float, float] | None:
    """(cosine of `update` with the members' mean update, the median over members of each
    one's cosine with the mean of the others), all computed at one model; None with fewer than
    two members (nothing to compare an agreement with)."""
    if len(members) < 2:
        return None
    stack = torch.stack(members).double()
    total = stack.sum(0)
    others = total - stack  # row i: the sum of the other members' updates
    own = torch.nn.functional.cosine_similarity(stack, others, dim=1)
    mover = torch.nn.functional.cosine_similarity(update.double(), total, dim=0)
    return float(mover), float(torch.quantile(own, 0.5))
