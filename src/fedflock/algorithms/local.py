"""Local training only: every client keeps its own model and never shares it."""

from __future__ import annotations

from typing import Any

from fedflock.algorithms.clustered import ClusteredAlgorithm
from fedflock.algorithms.registry import ALGORITHMS


@ALGORITHMS.register("local", "each client trains its own model alone (no federation)")
class Local(ClusteredAlgorithm):
    name = "local"

    def initial_clusters(self) -> list[list[int]]:
        return [[c] for c in range(self.num_clients)]

    @classmethod
    def newcomer_clusters(cls, state: dict[str, Any]) -> None:
        return None  # every model is one client's own
