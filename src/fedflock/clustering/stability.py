"""When a model has stopped settling, from the relative change of its rounds alone.

r_t = ||w_t - w_{t-1}|| / ||w_{t-1}|| for each round the model was trained. The model has
stabilised when r has stopped shrinking: its mean over the last `patience` rounds is down by less
than `tol` from the mean over the `patience` rounds before. The test is scale-free (whatever the
learning rate, model size or data) and counts the model's own rounds, not the round number, so a
cluster formed late is judged on its own history.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def relative_change(before: torch.Tensor, after: torch.Tensor) -> float:
    return float((after - before).norm() / before.norm().clamp_min(1e-12))


@dataclass
class Stabilisation:
    patience: int
    tol: float
    changes: list[float] = field(default_factory=list)
    last: torch.Tensor | None = None  # the model at the previous `observe`

    def add(self, before: torch.Tensor, after: torch.Tensor) -> float:
        change = relative_change(before, after)
        self.changes.append(change)
        return change

    def observe(self, model: torch.Tensor) -> None:
        """The model as it is now, once per round it is trained (the change is taken from
        the previous observation)."""
        if self.last is not None and model is not self.last:
            self.add(self.last, model)
        self.last = model

    def stable(self) -> bool:
        p = self.patience
        if len(self.changes) < 2 * p:
            return False
        recent = sum(self.changes[-p:])
        before = sum(self.changes[-2 * p : -p])
        return recent >= (1 - self.tol) * before
