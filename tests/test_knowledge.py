"""DistFL's distribution knowledge: inputs synthesised from BatchNorm statistics really move
(the loss falls at least 10x; the authors' detached-numpy loss never moves them), the model is
left as it was, the response divergence is the KL divergence it claims to be, and threshold
clustering finds groups without K and leaves a structureless cloud whole."""

from __future__ import annotations

import copy

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

from fedflock.clustering.threshold import (
    default_neighbours,
    neighbour_components,
    threshold_components,
)
from fedflock.config import ModelConfig
from fedflock.data.spec import DataSpec
from fedflock.models import build_model
from fedflock.similarity.knowledge import (
    batch_norm_layers,
    important_channels,
    response_divergence,
    synthesize_inputs,
)


def _bn_model(seed: int = 0) -> nn.Module:
    """The small BN ConvNet on scikit-learn's 8x8 digits, its running statistics those of the
    real images (what a trained model's are: statistics some input distribution produces)."""
    torch.manual_seed(seed)
    model = build_model(ModelConfig(name="cnn_bn"), DataSpec((1, 8, 8), 10))
    images = torch.from_numpy(load_digits().images / 16.0).float().unsqueeze(1)
    for layer in batch_norm_layers(model):
        layer.reset_running_stats()
        layer.momentum = None  # a cumulative average over the batches seen
        layer.weight.data.uniform_(0.2, 1.5)
    with torch.no_grad():
        model.train()
        for batch in images.split(256):
            model(batch)
    return model


def test_synthesis_moves_the_inputs_and_leaves_the_model_alone() -> None:
    model = _bn_model()
    before = copy.deepcopy(model.state_dict())
    result = synthesize_inputs(model, (1, 8, 8), count=64, steps=150, lr=0.1, seed=3)
    assert result.inputs.shape == (64, 1, 8, 8)
    assert result.losses[-1] <= result.losses[0] / 10, result.losses[::30]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.requires_grad for p in model.parameters()) and model.training


def test_important_channels_keep_the_top_share_of_scales() -> None:
    layer = nn.BatchNorm2d(6)
    layer.weight.data = torch.tensor([0.1, -2.0, 0.5, 1.0, -0.05, 3.0])
    assert important_channels(layer, 0.5).tolist() == [False, True, False, True, False, True]
    assert important_channels(layer, 1.0).all()


def test_response_divergence_is_the_mean_kl() -> None:
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(3, 5, 4, generator=gen), dim=-1)
    forward = response_divergence(probs, symmetric=False)
    i, j = 0, 2
    direct = (probs[i] * (probs[i] / probs[j]).log()).sum(-1).mean()
    assert torch.allclose(forward[i, j], direct.double(), atol=1e-9)
    assert torch.allclose(forward.diagonal(), torch.zeros(3, dtype=torch.float64), atol=1e-12)
    symmetric = response_divergence(probs)
    assert torch.allclose(symmetric, symmetric.T)
    assert torch.allclose(symmetric[i, j], (forward[i, j] + forward[j, i]) / 2)


# -- clustering without K ---------------------------------------------------------------------

def _distances(points: np.ndarray) -> np.ndarray:
    return np.linalg.norm(points[:, None] - points[None], axis=-1)


def test_threshold_components_join_on_either_direction() -> None:
    d = np.array([[0.0, 0.1, 5.0, 5.0],
                  [0.9, 0.0, 5.0, 5.0],
                  [5.0, 5.0, 0.0, 5.0],
                  [5.0, 5.0, 0.1, 0.0]])
    assert threshold_components(d, 0.2) == [[0, 1], [2, 3]]
    assert threshold_components(d, 0.05) == [[0], [1], [2], [3]]
    assert threshold_components(d, 10.0) == [[0, 1, 2, 3]]


def test_neighbour_components_find_groups_and_keep_one_cloud_whole() -> None:
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 20)) * 5
    grouped = np.concatenate([c + 0.3 * rng.normal(size=(10, 20)) for c in centres])
    d = _distances(grouped) ** 2
    k = default_neighbours(len(d))
    assert k == 3
    assert neighbour_components(d, k) == [list(range(0, 10)), list(range(10, 20)),
                                          list(range(20, 30))]
    far = d.copy()
    far[0, :] *= 1e6  # one client drifted far from everyone: it still finds its own group
    far[:, 0] *= 1e6
    assert neighbour_components(far, k) == neighbour_components(d, k)
    for seed in range(20):  # one cloud, heavy-tailed distances: never split, whatever its scale
        cloud = np.random.default_rng(seed).standard_t(2, size=(50, 30))
        d = _distances(cloud) ** 2 * 10.0 ** (seed % 5 - 2)
        assert neighbour_components(d, default_neighbours(50)) == [list(range(50))]


def test_neighbour_components_rank_by_the_closer_direction() -> None:
    d = np.array([[0.0, 9.0, 5.0, 5.0],
                  [0.1, 0.0, 5.0, 5.0],
                  [5.0, 5.0, 0.0, 0.1],
                  [5.0, 5.0, 9.0, 0.0]])
    assert neighbour_components(d, 1) == [[0, 1], [2, 3]]
    assert neighbour_components(d, 3) == [[0, 1, 2, 3]]
    assert neighbour_components(d, 0) == [[0], [1], [2], [3]]
    assert [default_neighbours(n) for n in (2, 8, 20, 50, 100, 1000)] == [2, 2, 3, 4, 5, 7]
