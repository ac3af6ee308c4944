"""The robust baselines of the DistFL comparison: residual-based reweighting (IRLS), autoencoder
detection (Credit) and group-wise robust aggregation (GRA), against references written here and
against honest/poisoned update sets whose right answer is known."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedflock.api import run
from fedflock.robust import (
    credit,
    gra,
    irls,
    kmeans_groups,
    repeated_median_line,
    weighted_median,
)
from fedflock.robust.gra import distance_embedding
from tests.conftest import small_config

# -- references -------------------------------------------------------------------------------


def _repeated_median_loops(y: np.ndarray) -> tuple[float, float]:
    """Siegel's line of sorted `y` against ranks 1..n, straight from the definition."""
    n = len(y)
    x = np.arange(1, n + 1, dtype=float)
    inner = [np.median([(y[j] - y[i]) / (x[j] - x[i]) for j in range(n) if j != i])
             for i in range(n)]
    slope = float(np.median(inner))
    return slope, float(np.median(y - slope * x))


def _irls_loops(u: np.ndarray, lam: float = 2.0, threshold: float = 0.1
                ) -> tuple[np.ndarray, np.ndarray]:
    """The method coordinate by coordinate, client by client (no floor on the scale: random
    data never needs it): Huber cut-off λ·√(2/n), each coordinate's confidences counted times
    their standard deviation, as in the authors' code."""
    n, size = u.shape
    x = np.arange(1, n + 1, dtype=float)
    leverage = 1 / n + (x - x.mean()) ** 2 / ((x - x.mean()) ** 2).sum()
    cut = lam * np.sqrt(2 / n)
    confidence = np.zeros(n)
    replaced = u.copy()
    for p in range(size):
        order = np.argsort(u[:, p], kind="stable")
        y = u[order, p]
        slope, intercept = _repeated_median_loops(y)
        fitted = intercept + slope * x
        r = y - fitted
        scale = 1.4826 * (1 + 5 / (n - 1)) * np.median(np.abs(r))
        weights = np.zeros(n)
        for k in range(n):
            e = r[k] / (scale * np.sqrt(1 - leverage[k]))
            w = 1.0 if abs(e) <= cut else cut / abs(e)
            weights[order[k]] = w
            if w < threshold:
                replaced[order[k], p] = fitted[k]
        confidence += weights * np.std(weights, ddof=1)
    client = (confidence / confidence.max()) ** 2
    return (client[:, None] * replaced).sum(0) / client.sum(), client


def _honest_and_flipped(honest: int = 15, flipped: int = 5, size: int = 3000, seed: int = 0
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Honest updates scattered around a common direction, and a coherent minority around its
    opposite (what label flipping does to an update, in caricature)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(size, generator=g, dtype=torch.float64)
    good = base + 0.5 * torch.randn(honest, size, generator=g, dtype=torch.float64)
    bad = -base + 0.5 * torch.randn(flipped, size, generator=g, dtype=torch.float64)
    return good, bad


def _error(aggregate: torch.Tensor, honest: torch.Tensor) -> float:
    target = honest.mean(0)
    return float((aggregate - target).norm() / target.norm())


# -- IRLS -------------------------------------------------------------------------------------


def test_repeated_median_line_by_hand_and_against_loops() -> None:
    # Slopes through each point: (1, 1.5, 33), (1, 2, 49), (1.5, 2, 96), (33, 49, 96); their
    # medians 1.5, 2, 2, 49 have median 2; y - 2x = (-1, -2, -2, 92) has median -1.5.
    slope, intercept = repeated_median_line(torch.tensor([[1.0, 2.0, 4.0, 100.0]],
                                                         dtype=torch.float64))
    assert (slope.item(), intercept.item()) == (2.0, -1.5)
    rng = np.random.default_rng(0)
    for n in range(2, 10):
        y = np.sort(rng.normal(size=(5, n)), axis=1)
        y[0] = np.sort(rng.integers(0, 3, size=n))  # ties
        s, i = repeated_median_line(torch.tensor(y))
        expected = np.array([_repeated_median_loops(row) for row in y])
        np.testing.assert_allclose(s.numpy(), expected[:, 0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(i.numpy(), expected[:, 1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [3, 4, 7, 10])
def test_irls_matches_a_coordinate_by_coordinate_reference(n: int) -> None:
    u = np.random.default_rng(n).standard_t(df=2, size=(n, 6))  # heavy tails
    u[0, :3] += 1000  # far enough to be replaced by the fitted line
    aggregate, weights = irls(torch.tensor(u))
    expected, client = _irls_loops(u)
    if n > 3:  # three points cannot outvote one: the line then follows the outlier
        assert np.abs(expected[:3]).max() < 100
    np.testing.assert_allclose(weights.numpy(), client, rtol=1e-10)
    np.testing.assert_allclose(aggregate.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_irls_on_identical_and_on_clean_updates_is_the_mean() -> None:
    same = torch.full((6, 9), 0.37)
    aggregate, weights = irls(same)
    assert torch.equal(aggregate, same[0]) and torch.equal(weights, torch.ones(6).double())
    good, _ = _honest_and_flipped(flipped=0)
    aggregate, weights = irls(good)  # the cut-off λ·√(2/n) = 0.63 costs some efficiency
    assert _error(aggregate, good) < 0.03 and weights.min() > 0.9


def test_irls_gives_an_outlier_client_no_weight() -> None:
    good, _ = _honest_and_flipped(honest=9, flipped=0, size=400)
    updates = torch.cat([good, 30 * torch.ones(1, 400, dtype=torch.float64)])
    aggregate, weights = irls(updates)
    assert weights[-1] < 1e-3 and weights[:-1].min() > 0.8
    assert _error(aggregate, good) < 0.02


def test_irls_resists_a_coherent_minority() -> None:
    good, bad = _honest_and_flipped()
    updates = torch.cat([good, bad])
    aggregate, weights = irls(updates)
    assert weights[15:].max() < 0.4 < 0.9 < weights[:15].min()
    assert _error(aggregate, good) < 0.3 * _error(updates.mean(0), good)


def test_irls_weights_ignore_coordinates_where_every_client_fits() -> None:
    # Coordinates on which all clients agree carry no evidence: adding any number of them must
    # not pull the flippers' weights towards the honest ones' (they count times the spread of
    # their confidences, zero there).
    good, bad = _honest_and_flipped(size=300)
    updates = torch.cat([good, bad])
    _, weights = irls(updates)
    padded = torch.cat([updates, torch.full((20, 30000), 0.25, dtype=torch.float64)], dim=1)
    aggregate, padded_weights = irls(padded)
    torch.testing.assert_close(padded_weights, weights, rtol=1e-12, atol=0)
    torch.testing.assert_close(aggregate[300:], torch.full((30000,), 0.25, dtype=torch.float64),
                               rtol=1e-12, atol=0)


def test_irls_does_not_depend_on_the_chunk_size() -> None:
    good, bad = _honest_and_flipped(size=61)
    updates = torch.cat([good, bad]).float()
    whole, w_whole = irls(updates)
    for chunk in (1, 7, 50):
        part, w_part = irls(updates, chunk=chunk)
        torch.testing.assert_close(part, whole, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(w_part, w_whole, rtol=1e-12, atol=0)
    assert whole.dtype == torch.float32


# -- Credit -----------------------------------------------------------------------------------


def _gross(size: int = 2000) -> tuple[torch.Tensor, torch.Tensor]:
    good, _ = _honest_and_flipped(honest=12, flipped=0, size=size, seed=3)
    g = torch.Generator().manual_seed(4)
    return good, 20 * torch.randn(3, size, generator=g, dtype=torch.float64)


def test_credit_excludes_gross_outliers_and_keeps_the_honest() -> None:
    good, bad = _gross()
    updates = torch.cat([good, bad])
    counts = torch.arange(1, 16).double()
    aggregate, kept, errors = credit(updates, counts, seed=5)
    assert not kept[12:].any() and kept[:12].sum() >= 6
    assert errors[12:].min() > errors[:12].max()
    w = counts * kept
    torch.testing.assert_close(aggregate, (w[:, None] * updates).sum(0) / w.sum())
    again = credit(updates, counts, seed=5)
    assert torch.equal(again[0], aggregate) and torch.equal(again[2], errors)


def test_credit_flags_a_coherent_minority() -> None:
    good, bad = _honest_and_flipped()
    _, kept, _ = credit(torch.cat([good, bad]), torch.ones(20), seed=0)
    assert not kept[15:].any() and kept[:15].any()


def test_credit_trained_on_everything_learns_the_outliers() -> None:
    """Why each training step fits only the best-reconstructed share: an autoencoder fitted to
    every surrogate spends itself on the largest ones, reconstructs them best and keeps them."""
    good, bad = _gross()
    updates = torch.cat([good, bad])
    for seed in (0, 1):
        assert not credit(updates, torch.ones(15), seed=seed)[1][12:].any()
        assert credit(updates, torch.ones(15), fit_share=1.0, seed=seed)[1][12:].any()


# -- GRA --------------------------------------------------------------------------------------


def test_weighted_median_by_hand() -> None:
    values = torch.tensor([[1.0, 5.0], [2.0, 4.0], [3.0, 0.0]], dtype=torch.float64)
    assert weighted_median(values, torch.tensor([1.0, 1.0, 5.0])).tolist() == [3.0, 0.0]
    assert weighted_median(values, torch.tensor([2.0, 1.0, 1.0])).tolist() == [1.5, 4.5]
    rows = torch.randn(6, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    np.testing.assert_allclose(weighted_median(rows, torch.ones(6)).numpy(),
                               np.median(rows.numpy(), axis=0))


def test_kmeans_on_the_distance_embedding_finds_separated_groups() -> None:
    g = torch.Generator().manual_seed(1)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], dtype=torch.float64)
    truth = torch.tensor([0, 1, 2] * 5)
    points = centres[truth] + 0.3 * torch.randn(15, 2, generator=g, dtype=torch.float64)
    embedded = distance_embedding(points)
    assert np.allclose(np.linalg.norm(embedded[:, None] - embedded[None], axis=-1),
                       torch.cdist(points, points).numpy(), atol=1e-8)
    labels = kmeans_groups(embedded, 3, seed=0)
    pairs_same = truth[:, None] == truth[None, :]
    assert torch.equal(labels[:, None] == labels[None, :], pairs_same)


def test_gra_resists_a_minority() -> None:
    good, bad = _honest_and_flipped()
    updates = torch.cat([good, bad])
    aggregate, labels = gra(updates, seed=0)
    assert not set(labels[:15].tolist()) & set(labels[15:].tolist())  # groups never mix
    assert _error(aggregate, good) < 0.5 * _error(updates.mean(0), good)
    good, bad = _gross()
    aggregate, _ = gra(torch.cat([good, bad]), seed=0)
    assert _error(aggregate, good) < 0.2
    assert torch.equal(gra(updates, seed=0)[0], gra(updates, seed=0)[0])


# -- end to end -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["irls", "credit", "gra"])
def test_runs_end_to_end_under_label_flipping(name: str, tmp_path: Path) -> None:
    raw = small_config(**{"rounds": 2, "data.clients": 8, "algorithm": {"name": name},
                          "data.scenario": {"kind": "iid"},
                          "attack": {"kind": "label_flip", "fraction": 0.25}})
    result = run(raw, tmp_path / name)
    assert result.summary["algorithm"] == name and result.summary["attack"]
    figures = result.metrics[-1]["robust"][0]
    key = {"irls": "weights", "credit": "excluded", "gra": "groups"}[name]
    assert key in figures
    if name == "irls":
        assert len(figures["weights"]) == 8 and max(figures["weights"]) == 1.0
