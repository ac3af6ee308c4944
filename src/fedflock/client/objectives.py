"""Objectives: how a task is trained and scored, in one place.

An objective gives the training loss (per sample, so tasks can weight samples), the evaluation
metrics of a client from its per-sample statistics, which metric is primary and whether higher
is better. Training, evaluation, selection and the summaries read it; nothing else hard-codes
cross-entropy or `argmax`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar

import torch
import torch.nn.functional as F

from fedflock.registry import Registry


class Objective(ABC):
    name: ClassVar[str]
    primary: ClassVar[str]
    higher_is_better: ClassVar[bool]
    metrics: ClassVar[tuple[str, ...]]
    # Metrics the summary reports beside the primary one, each with its direction.
    secondary: ClassVar[dict[str, bool]] = {}

    @abstractmethod
    def losses(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-sample loss, shape (batch,)."""

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean training loss of a batch."""
        return self.losses(outputs, targets).mean()

    @abstractmethod
    def predict(self, outputs: torch.Tensor) -> torch.Tensor:
        """The predicted target of every sample (for accuracy and attack success)."""

    @abstractmethod
    def sample_stats(self, outputs: torch.Tensor, targets: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
        """Per-sample sums that `summarise` turns into metrics (additive over samples)."""

    @abstractmethod
    def summarise(self, stats: dict[str, torch.Tensor]) -> dict[str, float]:
        """A client's metrics from the per-sample sums of its held-out samples."""

    def worst(self, values: list[float], metric: str | None = None) -> float:
        higher = self.higher_is_better if metric in (None, self.primary) else \
            self.secondary[metric]
        return min(values) if higher else max(values)


OBJECTIVES: Registry[type[Objective]] = Registry("objective")


@OBJECTIVES.register("classification", "cross-entropy; accuracy (primary, higher is better)")
class Classification(Objective):
    name = "classification"
    primary = "accuracy"
    higher_is_better = True
    metrics = ("accuracy", "loss")

    def losses(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets, reduction="none")

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)

    def predict(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.argmax(1)

    def sample_stats(self, outputs: torch.Tensor, targets: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
        return {"correct": (self.predict(outputs) == targets).float(),
                "loss": self.losses(outputs, targets)}

    def summarise(self, stats: dict[str, torch.Tensor]) -> dict[str, float]:
        if not stats or not len(stats["correct"]):
            return {"accuracy": math.nan, "loss": math.nan}
        return {"accuracy": float(stats["correct"].mean()), "loss": float(stats["loss"].mean())}


@OBJECTIVES.register("next_token", "token cross-entropy; perplexity (primary, lower is better)")
class NextToken(Objective):
    """Outputs (batch, time, vocabulary), targets (batch, time) of token ids. A sample's loss is
    its mean token loss; perplexity is exp of the mean over all tokens (token-count weighted)."""

    name = "next_token"
    primary = "perplexity"
    higher_is_better = False
    metrics = ("perplexity", "loss", "accuracy")
    secondary: ClassVar[dict[str, bool]] = {"accuracy": True}  # as LEAF reports it

    def _token_losses(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, -2), targets.flatten(),
                               reduction="none").view(targets.shape)

    def losses(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self._token_losses(outputs, targets).flatten(1).mean(1)

    def predict(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.argmax(-1)

    def sample_stats(self, outputs: torch.Tensor, targets: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
        tokens = self._token_losses(outputs, targets).flatten(1)
        correct = (self.predict(outputs) == targets).flatten(1)
        return {"loss_sum": tokens.sum(1), "correct": correct.sum(1).float(),
                "tokens": torch.full((len(tokens),), float(tokens.shape[1]))}

    def summarise(self, stats: dict[str, torch.Tensor]) -> dict[str, float]:
        tokens = float(stats["tokens"].sum()) if stats else 0.0
        if not tokens:
            return dict.fromkeys(self.metrics, math.nan)
        loss = float(stats["loss_sum"].sum()) / tokens
        return {"perplexity": math.exp(loss), "loss": loss,
                "accuracy": float(stats["correct"].sum()) / tokens}


def get_objective(name: str) -> Objective:
    return OBJECTIVES.get(name)()
