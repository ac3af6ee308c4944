"""What the server asks of a client and what it gets back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch


@dataclass
class TrainTask:
    """Train `client` from `params` (the model the server sends it) in round `round`.

    `mode="update"`: local SGD, reply with the weight-update; `mode="gradient"`: reply with one
    full-batch gradient step (-lr * grad), the CFL paper's gradient variant; `mode="select"`:
    `params` holds K models as rows; the client scores each on its own training data (accuracy,
    loss), trains the best one (highest accuracy, then lowest loss) and replies with that update,
    the scores in `payload` (K, 2) and the chosen row in `choice`. `epochs` overrides the
    configured local epochs (fine-tuning).
    """

    client: int
    params: torch.Tensor
    round: int
    mode: Literal["update", "gradient", "select"] = "update"
    epochs: int | None = None

    @property
    def model_size(self) -> int:
        """Length of one model vector (what a reply's update must have)."""
        return int(self.params.shape[-1])


@dataclass
class TrainReply:
    client: int
    update: torch.Tensor
    num_examples: int
    loss: float
    metrics: dict[str, float] = field(default_factory=dict)
    payload: torch.Tensor | None = None  # task-specific (select: per-model scores)
    choice: int | None = None  # select: the row of the task's models that was trained
