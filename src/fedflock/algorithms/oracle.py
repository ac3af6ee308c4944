"""FedAvg run separately inside given groups: the reference a clustering method should reach.

With no `clusters` given it takes the scenario's true groups from its context (it declares
`uses_ground_truth`), so it is an upper bound for evaluation, not a method (a real server does
not know the groups).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedflock.algorithms.clustered import ClusteredAlgorithm
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.errors import FedflockError


class OracleParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    clusters: list[list[int]] | None = Field(
        None, description="the groups to run FedAvg in (default: the true groups)")


@ALGORITHMS.register("oracle", "FedAvg inside each true group (an upper bound, not a method)")
class Oracle(ClusteredAlgorithm):
    name = "oracle"
    Params = OracleParams
    uses_ground_truth = True

    def initial_clusters(self) -> list[list[int]]:
        if self.params.clusters is not None:
            return [sorted(c) for c in self.params.clusters]
        groups = self.context.true_groups
        if groups is None:
            raise FedflockError("algorithm 'oracle' needs the true groups, which this "
                                "federation does not report (or give algorithm.clusters)")
        return [np.flatnonzero(groups == g).tolist() for g in np.unique(groups)]
