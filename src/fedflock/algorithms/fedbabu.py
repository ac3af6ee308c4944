"""FedBABU: federated learning of the body, the head left at its random start, then
fine-tuning (Oh, Kim and Yun, "FedBABU: Toward enhanced representation for federated image
classification", ICLR 2022).

During the run every sampled client trains only the body (all layers but the last), the head
held at the shared random initialisation, and the server averages the body (FedAvg: the head's
updates are zero). With the head fixed, the clients' bodies agree on one set of features
instead of pulling the classifier their own ways. After the last round each client
fine-tunes the whole model locally for `finetune_epochs` and is scored on its own fine-tuned
model, as FedAvg + fine-tuning (`fedavg_ft`), whose final step it shares.

It is the user of the training seam's held blocks (`Train.trainable`): a client trains the
coordinates the mask marks and no others, under plain SGD and DP-SGD alike.

Where this departs from the paper, and why:
- The head is the model's last layer with parameters, whatever the architecture (the paper's
  networks end in one linear classifier, so it is the same there).
- The final fine-tuning trains head and body with the run's local SGD (the paper also reports
  fine-tuning the head alone; the whole model is its default).
"""

from __future__ import annotations

import torch

from fedflock.algorithms.base import AlgorithmContext
from fedflock.algorithms.fedavg_ft import FedAvgFineTune, FineTuneParams
from fedflock.algorithms.registry import ALGORITHMS
from fedflock.client.tasks import Train
from fedflock.wire import Task


@ALGORITHMS.register("fedbabu", "FedBABU (Oh et al.): FedAvg on the body with the head frozen "
                     "at its random start, then local fine-tuning")
class FedBABU(FedAvgFineTune):
    name = "fedbabu"
    Params = FineTuneParams
    needs_model = True

    def __init__(self, params: FineTuneParams, context: AlgorithmContext) -> None:
        super().__init__(params, context)
        assert context.model is not None  # needs_model: refused under masking before this
        head = context.model.mask(context.model.layers()[-1:])
        self.body = (~head).to(torch.uint8)  # what a client trains during the run

    def train_task(self, rnd: int, client: int, params: torch.Tensor) -> Task:
        return Train(client, rnd, params, trainable=self.body)
