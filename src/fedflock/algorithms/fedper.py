"""FedPer: federated learning with personalization layers (Arivazhagan, Aggarwal, Singh and
Choudhary, 2019).

The model is a shared body (base layers) and a head of its last `personal_layers` layers that
each client keeps as its own. Each round a sampled client trains body and head together from
the shared body and its own head; the server averages the body's updates over the clients,
weighted by examples (FedAvg on the base layers), and keeps the new head to that client. A
client is scored on the shared body with its own head. There is one cluster: clients are not
grouped, only their heads differ.

The aggregation is a plan over the model's named layers (`fedflock.algorithms.blocks`): the
body's coordinates averaged over every reply, the head's over none (the shared model keeps its
initial head, which only a new client starts from).

Where this departs from the paper, and why:
- The paper's head never leaves the client. Here the server keeps each client's head and sends
  it with the body (as FedSoft's personal models): it sees the head in the reply anyway, and
  held by the server it is in the run's checkpoint, so a resumed run continues exactly, where
  state left on clients would be lost. The price is the head's floats, up and down.
- A client never sampled has no head of its own: it is scored on the shared model's initial
  head (under partial participation, a short run leaves such clients poorly served).
- A client that joins a trained run (`fedflock assign`) trains the shared model for
  `newcomer_epochs` before use, so that it has a head of its own (the paper does not say how
  new clients start).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import BaseModel, Field

from fedflock.algorithms.base import AlgorithmContext, AlgorithmParams, Cluster
from fedflock.algorithms.blocks import Part, blockwise_mean, examples
from fedflock.algorithms.clustered import ClusteredAlgorithm
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.client.tasks import Train
from fedflock.errors import ConfigError
from fedflock.wire import Reply, Task


class FedPerParams(AlgorithmParams):
    field_groups: ClassVar[dict[str, tuple[str, ...]]] = {
        "sharing": ("personal_layers",), "newcomers": ("newcomer_epochs",)}
    personal_layers: int = Field(1, ge=1, description="K_P, how many of the model's last "
                                 "layers with parameters each client keeps as its own head "
                                 "(the paper: 1 or 2); more fits each client's own labels "
                                 "more closely and shares less")
    newcomer_epochs: int = Field(3, ge=1, description="local epochs a client that joins a "
                                 "trained run trains the shared model before use, so that it "
                                 "has a head of its own")


@ALGORITHMS.register("fedper", "FedPer (Arivazhagan et al.): FedAvg on the body, each client's "
                     "last layers its own head")
class FedPer(ClusteredAlgorithm):
    name = "fedper"
    Params = FedPerParams
    state_fields = ("heads",)
    needs_model = True

    def __init__(self, params: FedPerParams, context: AlgorithmContext) -> None:
        super().__init__(params, context)
        assert context.model is not None  # needs_model: refused under masking before this
        layers = context.model.layers()
        if params.personal_layers >= len(layers):
            raise ConfigError(f"config: algorithm.personal_layers: {params.personal_layers} "
                              f"leaves no shared body in a model of {len(layers)} layers")
        self.head = context.model.mask(layers[-params.personal_layers:])
        self.heads: dict[int, torch.Tensor] = {}  # client -> its head's coordinates

    @classmethod
    def newcomer_finetune(cls, params: BaseModel) -> int:
        assert isinstance(params, FedPerParams)
        return params.newcomer_epochs

    def personal(self, client: int, shared: torch.Tensor) -> torch.Tensor:
        """The shared model with the client's own head (the shared one before it has any)."""
        head = self.heads.get(client)
        if head is None:
            return shared
        model = shared.clone()
        model[self.head] = head
        return model

    def train_task(self, rnd: int, client: int, params: torch.Tensor) -> Task:
        return Train(client, rnd, self.personal(client, params))

    def aggregate_train(self, rnd: int, replies: list[Reply]) -> dict[str, Any]:
        for r in replies:  # each head moves from what its client was sent
            sent = self.model_of(r.client)
            self.heads[r.client] = self.step(sent[self.head], r.update[self.head],
                                             f"client {r.client}'s head")
        return super().aggregate_train(rnd, replies)

    def combine(self, cluster: Cluster, replies: list[Reply], everyone: list[Reply]
                ) -> torch.Tensor:
        """The body averaged over the replies by examples; the shared head does not move."""
        return blockwise_mean(replies, [Part(~self.head, examples(replies))])

    def model_of(self, client: int) -> torch.Tensor:
        return self.personal(client, super().model_of(client))

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"heads": {c: h.clone() for c, h in self.heads.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.heads = {int(c): h.clone() for c, h in state["heads"].items()}
