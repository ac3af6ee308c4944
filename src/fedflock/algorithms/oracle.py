"""FedAvg run separately inside given groups: the reference a clustering method should reach.

With no `clusters` given it takes the scenario's true groups from its context (it declares
`uses_ground_truth`), so it is an upper bound for evaluation, not a method (a real server does
not know the groups).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from fedflock.algorithms.base import AlgorithmParams
from fedflock.algorithms.clustered import ClusteredAlgorithm
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.errors import ConfigError, FedflockError


class OracleParams(AlgorithmParams):
    clusters: list[list[int]] | None = Field(
        None, description="the groups to run FedAvg in (default: the true groups)")


@ALGORITHMS.register("oracle", "FedAvg inside each true group (an upper bound, not a method)")
class Oracle(ClusteredAlgorithm):
    name = "oracle"
    Params = OracleParams
    uses_ground_truth = True

    def initial_clusters(self) -> list[list[int]]:
        if self.params.clusters is not None:
            check_partition(self.params.clusters, self.num_clients)
            return [sorted(c) for c in self.params.clusters]
        groups = self.context.true_groups
        if groups is None:
            raise FedflockError("algorithm 'oracle' needs the true groups, which this "
                                "federation does not report (or give algorithm.clusters)")
        return [np.flatnonzero(groups == g).tolist() for g in np.unique(groups)]


def check_partition(parts: list[list[int]], num_clients: int) -> None:
    """`parts` must hold every client 0..num_clients-1 exactly once, in non-empty parts."""
    seen: set[int] = set()
    for part in parts:
        if not part:
            raise ConfigError("config: algorithm.clusters: an empty cluster")
        for client in part:
            if not 0 <= client < num_clients:
                raise ConfigError(f"config: algorithm.clusters: client {client} is not one of "
                                  f"0..{num_clients - 1}")
            if client in seen:
                raise ConfigError(f"config: algorithm.clusters: client {client} is in two "
                                  "clusters")
            seen.add(client)
    if len(seen) < num_clients:
        missing = min(set(range(num_clients)) - seen)
        raise ConfigError(f"config: algorithm.clusters: client {missing} is in no cluster "
                          "(the clusters must partition all clients)")
