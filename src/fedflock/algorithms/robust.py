"""FedAvg with a Byzantine-robust aggregation rule in place of the weighted mean: the defences
clustering is compared against under model poisoning (rules in `fedflock.robust`)."""

from __future__ import annotations

import torch
from pydantic import Field

from fedflock.algorithms.base import AlgorithmParams
from fedflock.algorithms.clustered import ClusteredAlgorithm
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.client.task import Reply
from fedflock.robust import coordinate_median, multi_krum, trimmed_mean


def _stack(replies: list[Reply]) -> torch.Tensor:
    return torch.stack([r.update for r in replies])


@ALGORITHMS.register("median", "FedAvg with the coordinate-wise median of updates (Yin et al.)")
class Median(ClusteredAlgorithm):
    name = "median"

    def combine(self, replies: list[Reply]) -> torch.Tensor:
        return coordinate_median(_stack(replies))


class TrimmedMeanParams(AlgorithmParams):
    beta: float = Field(0.2, ge=0, lt=0.5, description="fraction trimmed at each end")


@ALGORITHMS.register("trimmed_mean", "FedAvg with the coordinate-wise beta-trimmed mean")
class TrimmedMean(ClusteredAlgorithm):
    name = "trimmed_mean"
    Params = TrimmedMeanParams

    def combine(self, replies: list[Reply]) -> torch.Tensor:
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

    def combine(self, replies: list[Reply]) -> torch.Tensor:
        n = len(replies)
        f = int(self.params.byzantine * n)
        return multi_krum(_stack(replies), f, self.params.selected or n - f)


@ALGORITHMS.register("multi_krum", "FedAvg averaging the n-f updates with the best Krum scores")
class MultiKrum(Krum):
    name = "multi_krum"
    Params = MultiKrumParams
