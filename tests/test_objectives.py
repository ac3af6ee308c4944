"""Objectives own the loss and the metrics: classification and next-token scoring."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedflock.client.objectives import OBJECTIVES, get_objective


def test_classification_metrics_are_accuracy_and_mean_loss() -> None:
    obj = get_objective("classification")
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    y = torch.tensor([0, 0, 0])
    metrics = obj.summarise(obj.sample_stats(logits, y))
    assert metrics["accuracy"] == pytest.approx(2 / 3)
    assert metrics["loss"] == pytest.approx(float(F.cross_entropy(logits, y)))
    assert obj.primary == "accuracy" and obj.higher_is_better and obj.worst([0.2, 0.9]) == 0.2


def test_next_token_perplexity_is_weighted_by_token_count() -> None:
    obj = get_objective("next_token")
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(1, 4, 7, generator=gen), torch.randn(1, 2, 7, generator=gen)
    ya, yb = torch.randint(0, 7, (1, 4), generator=gen), torch.randint(0, 7, (1, 2),
                                                                        generator=gen)
    stats = [obj.sample_stats(a, ya), obj.sample_stats(b, yb)]
    merged = {k: torch.cat([s[k] for s in stats]) for k in stats[0]}
    metrics = obj.summarise(merged)
    tokens = torch.cat([F.cross_entropy(a[0], ya[0], reduction="none"),
                        F.cross_entropy(b[0], yb[0], reduction="none")])
    assert metrics["perplexity"] == pytest.approx(math.exp(float(tokens.mean())), rel=1e-6)
    assert metrics["loss"] == pytest.approx(float(tokens.mean()), rel=1e-6)
    assert obj.primary == "perplexity" and not obj.higher_is_better
    assert obj.worst([3.0, 9.0]) == 9.0  # the worst client has the highest perplexity
    assert obj.losses(a, ya).shape == (1,)


def test_no_held_out_samples_give_nan_metrics() -> None:
    for name in OBJECTIVES:
        metrics = get_objective(name).summarise({})
        assert metrics and all(math.isnan(v) for v in metrics.values())
