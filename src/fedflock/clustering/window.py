"""The updates a split test looks at: one window of a cluster's members' updates.

A window collects the updates of the members that train the cluster's model until `needed`
distinct members have sent one (a member sending again replaces its earlier update), then closes
and the next one starts empty. Under full participation, or whenever enough members reply in one
round, a window is one round: the same-round updates CFL's paper assumes. When fewer reply, it
spans the fewest rounds that reach `needed` instead of skipping those rounds, so every
participation rate gets a statistic. Updates of different rounds were computed at different
models and also differ by age, which a bipartition would cut along; so a window may span rounds
only when it began once the model had settled (`may_span`, see `Stabilisation`): before that,
an unfinished window is dropped at the end of its round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedflock.similarity import cosine_from_gram, gram_matrix


@dataclass
class Window:
    clients: list[int]  # sorted; the row order of the fields below
    updates: torch.Tensor  # (n, d)
    gram: torch.Tensor  # (n, n) float64
    similarity: np.ndarray  # (n, n) cosine, from the Gram matrix
    examples: np.ndarray  # (n,) training examples behind each update


@dataclass
class UpdateWindow:
    updates: dict[int, torch.Tensor] = field(default_factory=dict)  # the open window
    examples: dict[int, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.updates)

    def add(self, clients: list[int], updates: torch.Tensor, examples: list[int],
            needed: int, may_span: bool = True) -> Window | None:
        """Add this round's updates; the closed window once it holds `needed` members (an
        unfinished one is dropped unless it `may_span` rounds)."""
        for client, update, count in zip(clients, updates, examples, strict=True):
            self.updates[client] = update.clone()  # not a view of the round's stacked (k, P)
            # replies: a view keeps all k alive while the window is open, and a checkpoint
            # saves the whole stack for it
            self.examples[client] = count
        if len(self.updates) < needed:
            if not may_span:
                self.updates, self.examples = {}, {}
            return None
        held = sorted(self.updates)
        stacked = torch.stack([self.updates[c] for c in held])
        gram = gram_matrix(stacked)
        window = Window(held, stacked, gram, cosine_from_gram(gram).numpy(),
                        np.array([float(self.examples[c]) for c in held]))
        self.updates, self.examples = {}, {}
        return window

    def forget(self, client: int) -> None:
        """Drop a client's update from the open window (it left the cluster)."""
        self.updates.pop(client, None)
        self.examples.pop(client, None)

    def state_dict(self) -> dict[str, Any]:
        return {"updates": dict(self.updates), "examples": dict(self.examples)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> UpdateWindow:
        return cls({int(k): v for k, v in state["updates"].items()},
                   {int(k): v for k, v in state["examples"].items()})
