"""The client side of a federation: local data, the model template and the privacy mask.

Every engine drives clients through this object (the embedded executors and a Flower ClientApp
alike): it unmasks what the server sends, runs the task, and masks what goes back.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch

from fedflock.client.protocol import TrainReply, TrainTask
from fedflock.client.training import evaluate_model, gradient_step, task_seed, train_model
from fedflock.config import AttackConfig, ModelConfig, PrivacyConfig, TrainingConfig
from fedflock.data.scenarios import FederatedData
from fedflock.models import FlatSpec, build_model
from fedflock.privacy import PermutationMask
from fedflock.robust.malicious import check_label_map, flip_labels, malicious_clients


class ClientRuntime:
    def __init__(self, data: FederatedData, model: ModelConfig, training: TrainingConfig,
                 seed: int, privacy: PrivacyConfig | None = None,
                 attack: AttackConfig | None = None) -> None:
        self.dtype = torch.float64 if training.dtype == "float64" else torch.float32
        self.data = data
        self.model_cfg = model
        self.training = training
        self.seed = seed
        self.model = build_model(model, data.input_shape, data.num_classes).to(self.dtype)
        self.spec = FlatSpec.of(self.model)
        # Evaluation only: conv nets run about 2x faster channels-last on CPU (same accuracy;
        # training keeps the default layout so every executor computes identical updates).
        self.eval_model = copy.deepcopy(self.model)
        if len(data.input_shape) == 3:
            self.eval_model = self.eval_model.to(memory_format=torch.channels_last)
        privacy = privacy or PrivacyConfig()
        self.mask = PermutationMask(self.spec, privacy.mask_seed) if privacy.masking else None
        for c in data.clients:
            c.x_train, c.x_test = c.x_train.to(self.dtype), c.x_test.to(self.dtype)
        self.attack = attack
        self.malicious = malicious_clients(attack, len(data.clients), seed)
        if attack is not None and attack.poisons_data:
            check_label_map(attack, data.num_classes)
            for c in self.malicious:
                client = data.clients[c]
                client.y_train = flip_labels(client.y_train, attack.label_map)

    @property
    def num_clients(self) -> int:
        return len(self.data.clients)

    def num_examples(self, client: int) -> int:
        return self.data.clients[client].num_train

    def initial_params(self) -> torch.Tensor:
        """The model every client agrees to start from (seeded), as the server will hold it."""
        torch.manual_seed(self.seed)
        model = build_model(self.model_cfg, self.data.input_shape, self.data.num_classes)
        return self.send(self.spec.flatten(model.to(self.dtype)))

    def receive(self, vector: torch.Tensor) -> torch.Tensor:
        return self.mask.unmask(vector) if self.mask is not None else vector

    def send(self, vector: torch.Tensor) -> torch.Tensor:
        return self.mask.mask(vector) if self.mask is not None else vector

    def task_seed(self, task: TrainTask) -> int:
        salt = "train" if task.epochs is None else "finetune"
        return task_seed(self.seed, task.round, task.client, salt)

    def train(self, task: TrainTask) -> TrainReply:
        data = self.data.clients[task.client]
        scores, choice, params = None, None, task.params
        if task.mode == "select":
            scores = self.scores(task.client, task.params)
            # highest accuracy, then lowest loss (lexicographic on (accuracy, -loss))
            choice = int(max(range(len(scores)), key=lambda k: (scores[k, 0], -scores[k, 1])))
            params = task.params[choice]
        start = self.receive(params).to(self.dtype)
        if task.mode == "gradient":
            update, loss = gradient_step(self.model, self.spec, start, data.x_train,
                                         data.y_train, self.training)
        else:
            update, loss = train_model(self.model, self.spec, start, data.x_train, data.y_train,
                                       self.training, self.task_seed(task), task.epochs)
        return TrainReply(task.client, self.send(update), data.num_train, loss,
                          payload=scores, choice=choice)

    def train_many(self, tasks: Iterable[TrainTask]) -> list[TrainReply]:
        return [self.train(t) for t in tasks]

    def scores(self, client: int, models: torch.Tensor) -> torch.Tensor:
        """(accuracy, mean loss) of each of K models (rows) on the client's training data: how a
        client picks the cluster model that fits it (incremental clustering, IFCA)."""
        data = self.data.clients[client]
        out = []
        for params in models:
            self.spec.load(self.eval_model, self.receive(params).to(self.dtype))
            predicted, losses = evaluate_model(self.eval_model, _eval_layout(data.x_train),
                                               data.y_train)
            accuracy = (predicted == data.y_train).double().mean()
            out.append(torch.stack([accuracy, losses.double().mean()]))
        return torch.stack(out)

    def losses(self, client: int, models: torch.Tensor) -> torch.Tensor:
        """Mean training loss of each of K models (rows) on the client's data (IFCA-style
        cluster selection)."""
        return self.scores(client, models)[:, 1].to(self.dtype)

    def basis(self, client: int, rank: int) -> torch.Tensor:
        """The top `rank` left singular vectors of the client's flattened training inputs
        (d, rank): a data signature that reveals no sample (PACFL-style)."""
        x = self.data.clients[client].x_train.reshape(len(self.data.clients[client].y_train), -1)
        u, _, _ = torch.linalg.svd(x.T.double(), full_matrices=False)
        return u[:, :rank].to(self.dtype)

    @torch.no_grad()
    def responses(self, params: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        """Softmax outputs of a model on server-provided inputs (DistFL-style)."""
        self.spec.load(self.eval_model, self.receive(params).to(self.dtype))
        self.eval_model.eval()
        return torch.softmax(self.eval_model(inputs.to(self.dtype)), dim=1)

    def evaluate(self, models: dict[int, torch.Tensor]) -> dict[int, tuple[float, float]]:
        """(accuracy, loss) of each client's own model on its held-out data.

        Clients sharing one model tensor (a cluster) are evaluated in one forward pass.
        """
        by_model: dict[int, list[int]] = {}
        tensors: dict[int, torch.Tensor] = {}
        for client, params in models.items():
            by_model.setdefault(id(params), []).append(client)
            tensors[id(params)] = params
        out: dict[int, tuple[float, float]] = {}
        for key, clients in by_model.items():
            self.spec.load(self.eval_model, self.receive(tensors[key]).to(self.dtype))
            xs = torch.cat([self.data.clients[c].x_test for c in clients])
            ys = torch.cat([self.data.clients[c].y_test for c in clients])
            predicted, losses = evaluate_model(self.eval_model, _eval_layout(xs), ys)
            correct = predicted == ys
            offset = 0
            for c in clients:
                n = len(self.data.clients[c].y_test)
                acc = float(correct[offset : offset + n].float().mean()) if n else float("nan")
                loss = float(losses[offset : offset + n].mean()) if n else float("nan")
                out[c] = (acc, loss)
                offset += n
        return out

    @torch.no_grad()
    def attack_success(self, models: dict[int, torch.Tensor], label_map: dict[int, int]
                       ) -> dict[int, tuple[int, int]]:
        """Per client: (test samples of a targeted class predicted as the attacker's target for
        it, test samples of a targeted class)."""
        out = {}
        for client, params in models.items():
            data = self.data.clients[client]
            targeted = torch.isin(data.y_test, torch.tensor(list(label_map)))
            if not targeted.any():
                out[client] = (0, 0)
                continue
            self.spec.load(self.eval_model, self.receive(params).to(self.dtype))
            x, y = data.x_test[targeted], data.y_test[targeted]
            predicted, _ = evaluate_model(self.eval_model, _eval_layout(x), y)
            hits = int((predicted == flip_labels(y, label_map)).sum())
            out[client] = (hits, len(y))
        return out


def _eval_layout(x: torch.Tensor) -> torch.Tensor:
    """Images in the channels-last layout of the evaluation copy of the model."""
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x
