"""The client side of a federation: local data, the model template, the objective, the mask and
the differential-privacy mechanism.

It serves the clients whose data it holds: every client of a federation on the embedded engine,
one partition on a deployed node (`NodeData`).

What a client keeps between rounds (a personal model, optimiser moments, an accountant's
history) is `state(client)`: named tensors a task reads and updates in place. The runtime holds
it on the embedded engine (the processes executor ships a client's state to the worker with its
task and back with its reply); on Flower the ClientApp loads it from the node's `Context.state`
before a message's tasks and stores it there after, so a task sees the same state on both.

Every engine drives clients through this object (the embedded executors and a Flower ClientApp
alike): a task reads the client's data and the model from it, `receive` unmasks what the server
sent and `send` masks what goes back; `dp` (when configured) noises updates before `send`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from itertools import groupby

import torch
from torch import nn

from fedflock.client import training as routines
from fedflock.client.objectives import Objective, get_objective
from fedflock.client.training import task_seed
from fedflock.config import AttackConfig, ModelConfig, PrivacyConfig, TrainingConfig
from fedflock.data.partition import NodeData
from fedflock.data.poisoning import check_label_map, flip_labels, malicious_clients
from fedflock.data.scenarios import ClientData, FederatedData
from fedflock.errors import ConfigError
from fedflock.models import FlatSpec, ModelHandle, build_model
from fedflock.privacy import ClientDP, PermutationMask
from fedflock.wire import Reply, Task


class ClientRuntime:
    routines = routines  # the training loop the tasks run (the wire layer imports none of it)

    def __init__(self, data: FederatedData | NodeData, model: ModelConfig, training: TrainingConfig,
                 seed: int, privacy: PrivacyConfig | None = None,
                 attack: AttackConfig | None = None) -> None:
        self.dtype = torch.float64 if training.dtype == "float64" else torch.float32
        self.data = data
        self.clients = data.held()
        self.data_spec = data.spec
        self.objective: Objective = get_objective(self.data_spec.objective)
        self.model_cfg = model
        self.training = training
        self.seed = seed
        self.model = build_model(model, self.data_spec).to(self.dtype)
        self.spec = FlatSpec.of(self.model)
        # Evaluation only: conv nets run about 2x faster channels-last on CPU (same accuracy;
        # training keeps the default layout so every executor computes identical updates).
        self.eval_model = copy.deepcopy(self.model)
        if len(self.data_spec.input_shape) == 3:
            self.eval_model = self.eval_model.to(memory_format=torch.channels_last)
        privacy = privacy or PrivacyConfig()
        self.mask = PermutationMask(self.spec, privacy.mask_seed) if privacy.masking else None
        self.dp = None if privacy.dp is None else ClientDP(
            privacy.dp, training, self.model, self.spec, list(data.sizes), model.name)
        for c in self.clients.values():  # integer inputs (token ids) stay integer
            if c.x_train.is_floating_point():
                c.x_train, c.x_test = c.x_train.to(self.dtype), c.x_test.to(self.dtype)
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        self.attack = attack
        self.malicious = malicious_clients(attack, data.num_clients, seed)
        # malicious client -> (honest, flipped) training labels, chosen by each task's round:
        # before attack.start_round an attacker trains honestly (a sleeper)
        self.labels: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if attack is not None and attack.poisons_data:
            if self.data_spec.objective != "classification":
                raise ConfigError(f"config: attack.kind: {attack.kind!r} flips class labels, "
                                  f"which objective {self.data_spec.objective!r} does not have "
                                  "(its targets are the next tokens); use a model-poisoning "
                                  "attack such as sign_flip")
            check_label_map(attack, self.data_spec.num_classes)
            for c in (c for c in self.malicious if c in self.clients):
                client = self.clients[c]
                self.labels[c] = (client.y_train, flip_labels(client.y_train, attack.label_map))
                client.y_train = self.labels[c][1]

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    def num_examples(self, client: int) -> int:
        return self.clients[client].num_train

    def client_data(self, client: int) -> ClientData:
        return self.clients[client]

    def state(self, client: int) -> dict[str, torch.Tensor]:
        """What `client` keeps between rounds (empty at first); update it in place."""
        return self.states.setdefault(client, {})

    # -- models ----------------------------------------------------------------------------
    def model_handle(self) -> ModelHandle:
        return ModelHandle(lambda: build_model(self.model_cfg, self.data_spec), self.dtype,
                           self.data_spec.input_shape)

    def initial_params(self) -> torch.Tensor:
        """The model every client agrees to start from (seeded), as the server will hold it."""
        return self.initial_models(1)[0]

    def initial_models(self, count: int) -> torch.Tensor:
        """`count` distinct seeded initialisations (K, P); the first is `initial_params`."""
        rows = []
        for k in range(count):
            torch.manual_seed(self.seed if k == 0 else task_seed(self.seed, 0, k, "init"))
            model = build_model(self.model_cfg, self.data_spec)
            rows.append(self.send(self.spec.flatten(model.to(self.dtype))))
        return torch.stack(rows)

    def receive(self, vector: torch.Tensor) -> torch.Tensor:
        vector = self.mask.unmask(vector) if self.mask is not None else vector
        vector = self.dp.project(vector) if self.dp is not None else vector
        return vector.to(self.dtype)

    def send(self, vector: torch.Tensor) -> torch.Tensor:
        return self.mask.mask(vector) if self.mask is not None else vector

    def load_eval(self, params: torch.Tensor) -> nn.Module:
        """The evaluation copy of the model holding the (masked) `params` the server sent."""
        return self.load_received(self.receive(params))

    def load_received(self, vector: torch.Tensor) -> nn.Module:
        """The evaluation copy of the model holding a vector already `receive`d (a task that
        also trains from it unmasks it once)."""
        self.spec.load(self.eval_model, vector)
        return self.eval_model

    def task_seed(self, task: Task, salt: str = "train") -> int:
        return task_seed(self.seed, task.round, task.client, salt)

    # -- tasks -----------------------------------------------------------------------------
    def _poison(self, tasks: Sequence[Task]) -> None:
        """Give each malicious client of `tasks` the labels of its task's round."""
        if not self.labels or self.attack is None or self.attack.start_round == 1:
            return
        for task in tasks:
            if task.client in self.labels:
                honest, flipped = self.labels[task.client]
                late = task.round < self.attack.start_round
                self.clients[task.client].y_train = honest if late else flipped

    def run(self, tasks: Sequence[Task]) -> list[Reply]:
        """Replies in the order of `tasks`; tasks of one kind that follow each other run
        together (`Task.run_many`), so a kind can share work (one pass per shared model)."""
        self._poison(tasks)
        out: list[Reply] = []
        for _, group in groupby(tasks, key=type):
            batch = list(group)
            out.extend(type(batch[0]).run_many(self, batch))
        return out

