"""FedAvg with a Byzantine-robust aggregation rule in place of the weighted mean: the defences
clustering is compared against under model poisoning, and the baselines of DistFL's
label-flipping table (IRLS, Credit, GRA). The rules live in `fedflock.robust`."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from fedflock.algorithms.base import AlgorithmContext, AlgorithmParams, Cluster
from fedflock.algorithms.clustered import ClusteredAlgorithm
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.robust import coordinate_median, credit, gra, irls, multi_krum, trimmed_mean
from fedflock.wire import Reply


def _stack(replies: list[Reply]) -> torch.Tensor:
    return torch.stack([r.update for r in replies])


@ALGORITHMS.register("median", "FedAvg with the coordinate-wise median of updates (Yin et al.)")
class Median(ClusteredAlgorithm):
    name = "median"

    def combine(self, cluster: Cluster, replies: list[Reply], everyone: list[Reply]
                ) -> torch.Tensor:
        return coordinate_median(_stack(replies))


class TrimmedMeanParams(AlgorithmParams):
    beta: float = Field(0.2, ge=0, lt=0.5, description="fraction trimmed at each end")


@ALGORITHMS.register("trimmed_mean", "FedAvg with the coordinate-wise beta-trimmed mean")
class TrimmedMean(ClusteredAlgorithm):
    name = "trimmed_mean"
    Params = TrimmedMeanParams

    def combine(self, cluster: Cluster, replies: list[Reply], everyone: list[Reply]
                ) -> torch.Tensor:
        return trimmed_mean(_stack(replies), self.params.beta)


class KrumParams(AlgorithmParams):
    byzantine: float = Field(0.2, ge=0, lt=0.5,
                             description="assumed Byzantine share f/n of a round's replies")
    selected: int | None = Field(1, ge=1, description="updates averaged (None: n - f)")


class MultiKrumParams(KrumParams):
    selected: int | None = Field(None, ge=1, description="updates averaged (None: n - f)")


@ALGORITHMS.register("krum", "FedAvg keeping the one update closest to its n-f-2 neighbours")
class Krum(ClusteredAlgorithm):
    name = "krum"
    Params = KrumParams

    def combine(self, cluster: Cluster, replies: list[Reply], everyone: list[Reply]
                ) -> torch.Tensor:
        n = len(replies)
        f = int(self.params.byzantine * n)
        return multi_krum(_stack(replies), f, self.params.selected or n - f)


@ALGORITHMS.register("multi_krum", "FedAvg averaging the n-f updates with the best Krum scores")
class MultiKrum(Krum):
    name = "multi_krum"
    Params = MultiKrumParams


class _Reporting(ClusteredAlgorithm):
    """A robust rule that reports, in the round's record (`robust`), what it decided for each
    cluster it combined (weights, exclusions, groups): figures to check a defence against the
    run's malicious clients."""

    def __init__(self, params: Any, context: AlgorithmContext) -> None:
        super().__init__(params, context)
        self._figures: list[dict[str, Any]] = []

    def aggregate_train(self, rnd: int, replies: list[Reply]) -> dict[str, Any]:
        self._figures = []
        out = super().aggregate_train(rnd, replies)
        if self._figures:
            out["robust"] = self._figures
        return out


class IRLSParams(AlgorithmParams):
    lam: float = Field(2.0, gt=0, description="λ of the Huber cut-off λ·√(2/n) on the "
                       "standardised residuals (paper: 2); lower it to down-weight outlying "
                       "values sooner")
    threshold: float = Field(0.1, ge=0, le=1, description="a value whose confidence is below "
                             "this is replaced by the fitted line (paper: 0.1)")


@ALGORITHMS.register("irls", "FedAvg with residual-based reweighting (repeated median, Fu et al.)")
class IRLS(_Reporting):
    name = "irls"
    Params = IRLSParams

    def combine(self, cluster: Cluster, replies: list[Reply], everyone: list[Reply]
                ) -> torch.Tensor:
        aggregate, weights = irls(_stack(replies), self.params.lam, self.params.threshold)
        self._figures.append({"clients": [r.client for r in replies],
                              "weights": [round(float(w), 4) for w in weights]})
        return aggregate


class CreditParams(AlgorithmParams):
    dim: int = Field(256, ge=2, description="surrogate size (count sketch of each update)")
    hidden: int = Field(64, ge=1, description="autoencoder hidden width")
    code: int = Field(8, ge=1, description="autoencoder bottleneck width")
    steps: int = Field(200, ge=1, description="full-batch Adam steps per round")
    lr: float = Field(0.01, gt=0, description="autoencoder learning rate")
    fit_share: float = Field(0.5, gt=0, le=1, description="share of the round's surrogates "
                             "(best reconstructed) each step fits; 1: plain online training")


@ALGORITHMS.register("credit", "FedAvg without clients an autoencoder flags (Li et al. 2019)")
class Credit(_Reporting):
    name = "credit"
    Params = CreditParams

    def combine(self, cluster: Cluster, replies: list[Reply], everyone: list[Reply]
                ) -> torch.Tensor:
        p = self.params
        updates = _stack(replies)
        counts = torch.tensor([float(r.num_examples) for r in replies])
        aggregate, kept, _ = credit(updates, counts, detect=updates[:, : self.update_size],
                                    dim=p.dim, hidden=p.hidden, code=p.code, steps=p.steps,
                                    lr=p.lr, fit_share=p.fit_share, seed=self.context.seed)
        self._figures.append({"excluded": [r.client for r, k in zip(replies, kept, strict=True)
                                           if not k]})
        return aggregate


class GRAParams(AlgorithmParams):
    groups: int | None = Field(None, ge=1, description="k-means groups (None: ceil(sqrt(n)) "
                               "of a round's replies)")
    restarts: int = Field(5, ge=1, description="seeded k-means runs; the lowest inertia wins")


@ALGORITHMS.register("gra", "FedAvg with group-wise robust aggregation (k-means, medians)")
class GRA(_Reporting):
    name = "gra"
    Params = GRAParams

    def combine(self, cluster: Cluster, replies: list[Reply], everyone: list[Reply]
                ) -> torch.Tensor:
        updates = _stack(replies)
        aggregate, labels = gra(updates, self.params.groups,
                                features=updates[:, : self.update_size],
                                seed=self.context.seed, restarts=self.params.restarts)
        self._figures.append({"groups": [[r.client for r, g in zip(replies, labels, strict=True)
                                          if g == k] for k in range(int(labels.max()) + 1)]})
        return aggregate
