"""Server logic of a federated algorithm, independent of any engine.

An engine asks `configure_train` what each sampled client must do, runs the tasks, hands the
replies to `aggregate_train`, and evaluates every client on `model_of(client)`. Algorithms see
flat parameter vectors only (see `fedflock.models.flat`); the first `update_size` entries of an
update are the trainable part used for similarity and norms.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict

from fedflock.client.protocol import TrainReply, TrainTask


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass
class Cluster:
    id: int
    members: list[int]
    params: torch.Tensor
    history: list[float] = field(default_factory=list)  # per-round split statistic (CFL)


class Algorithm(ABC):
    name: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = NoParams

    def __init__(self, params: BaseModel, num_clients: int, initial: torch.Tensor,
                 update_size: int) -> None:
        self.params = params
        self.num_clients = num_clients
        self.update_size = update_size
        self.splits: list[dict[str, Any]] = []
        self.split_matrices: list[tuple[list[int], Any]] = []

    @abstractmethod
    def configure_train(self, rnd: int, clients: list[int]) -> list[TrainTask]:
        """Tasks for the clients sampled in round `rnd`."""

    @abstractmethod
    def aggregate_train(self, rnd: int, replies: list[TrainReply]) -> dict[str, Any]:
        """Update models/clusters from the replies; return round diagnostics (JSON-friendly)."""

    @abstractmethod
    def model_of(self, client: int) -> torch.Tensor:
        """The model `client` uses for evaluation (clients of a cluster share one tensor)."""

    @abstractmethod
    def clusters(self) -> list[list[int]]:
        """The current partition of all clients."""

    def num_clusters(self) -> int:
        """Clusters with a model of their own (clients waiting to be placed form none)."""
        return len(self.clusters())

    def unplaced(self) -> list[int]:
        """Clients that belong to no cluster yet (partial participation); none by default."""
        return []

    def final_tasks(self, rnd: int, clients: list[int]) -> list[TrainTask]:
        """Extra tasks after the last round (e.g. fine-tuning); none by default."""
        return []

    def finalize(self, replies: list[TrainReply]) -> None:  # noqa: B027 (optional hook)
        """Consume the replies of `final_tasks`."""

    def tree(self) -> list[dict[str, Any]] | None:
        return None

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
