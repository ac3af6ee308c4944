"""FedAvg run separately inside given groups: the reference a clustering method should reach.

With no `clusters` given, the experiment fills in the scenario's true groups, so this is an
upper bound for evaluation, not a method (a real server does not know the groups).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from fedflock.algorithms.clustered import ClusteredAlgorithm
from fedflock.algorithms.registry import ALGORITHMS


class OracleParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    clusters: list[list[int]] | None = None


@ALGORITHMS.register("oracle", "FedAvg inside each true group (an upper bound, not a method)")
class Oracle(ClusteredAlgorithm):
    name = "oracle"
    Params = OracleParams
    needs_true_groups = True

    def initial_clusters(self) -> list[list[int]]:
        if self.params.clusters is None:
            raise ValueError("oracle needs algorithm.clusters (the experiment fills true groups)")
        return [sorted(c) for c in self.params.clusters]
