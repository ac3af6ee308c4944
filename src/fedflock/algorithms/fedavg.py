"""FedAvg (McMahan et al. 2017): one model, the example-weighted mean of client updates."""

from __future__ import annotations

from fedflock.algorithms.clustered import ClusteredAlgorithm
from fedflock.algorithms.registry import ALGORITHMS


@ALGORITHMS.register("fedavg", "FedAvg: one global model, example-weighted update averaging")
class FedAvg(ClusteredAlgorithm):
    name = "fedavg"
