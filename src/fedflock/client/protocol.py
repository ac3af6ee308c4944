"""What the server asks of a client and what it gets back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch


@dataclass
class TrainTask:
    """Train `client` from `params` (the model the server sends it) in round `round`.

    `mode="update"`: local SGD, reply with the weight-update; `mode="gradient"`: reply with one
    full-batch gradient step (-lr * grad), the CFL paper's gradient variant. `epochs` overrides the
    configured local epochs (fine-tuning).
    """

    client: int
    params: torch.Tensor
    round: int
    mode: Literal["update", "gradient"] = "update"
    epochs: int | None = None


@dataclass
class TrainReply:
    client: int
    update: torch.Tensor
    num_examples: int
    loss: float
    metrics: dict[str, float] = field(default_factory=dict)
