"""FedAvg followed by local fine-tuning of the final global model on each client."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, Field

from fedflock.algorithms.base import AlgorithmParams
from fedflock.algorithms.clustered import ClusteredAlgorithm
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.client.tasks import Train
from fedflock.wire import Reply, Task


class FineTuneParams(AlgorithmParams):
    finetune_epochs: int = Field(3, ge=1, description="local epochs of the final fine-tuning")


@ALGORITHMS.register("fedavg_ft", "FedAvg, then each client fine-tunes the global model locally")
class FedAvgFineTune(ClusteredAlgorithm):
    name = "fedavg_ft"
    Params = FineTuneParams
    state_fields = ("personal", "finetuned")
    final_releases = 1  # the fine-tuned update goes to the server (its model is scored there)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.personal: dict[int, torch.Tensor] = {}
        self.finetuned = False

    @classmethod
    def newcomer_finetune(cls, params: BaseModel) -> int:
        assert isinstance(params, FineTuneParams)
        return params.finetune_epochs

    def final_tasks(self, rnd: int, clients: list[int]) -> list[Task]:
        if self.finetuned:
            return []
        return [Train(c, rnd, self.model_of(c), epochs=self.params.finetune_epochs)
                for c in clients]

    def finalize(self, replies: list[Reply]) -> None:
        self.personal = {r.client: self.step(self.model_of(r.client), r.update,
                                             f"client {r.client}'s fine-tuned model")
                         for r in replies}
        self.finetuned = True

    def model_of(self, client: int) -> torch.Tensor:
        return self.personal.get(client, super().model_of(client))

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"personal": self.personal, "finetuned": self.finetuned}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.personal = state["personal"]
        self.finetuned = state["finetuned"]
