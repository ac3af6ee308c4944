"""The embedded engine: all clients on this machine, run by the fastest executor."""

from __future__ import annotations

import numpy as np
import torch

from fedflock.client.executors import Executor, choose_executor
from fedflock.client.protocol import TrainReply, TrainTask
from fedflock.client.runtime import ClientRuntime
from fedflock.config import ExperimentConfig
from fedflock.data.scenarios import build_federated_data
from fedflock.engines.base import Engine


class EmbeddedEngine(Engine):
    name = "embedded"

    def __init__(self, runtime: ClientRuntime, executor: Executor) -> None:
        super().__init__()
        self.runtime = runtime
        self.executor = executor

    @classmethod
    def from_config(cls, config: ExperimentConfig) -> EmbeddedEngine:
        data = build_federated_data(config.data, config.seed)
        runtime = ClientRuntime(data, config.model, config.training, config.seed,
                                config.privacy, config.attack)
        executor = choose_executor(runtime, config.training.executor, config.training.workers)
        return cls(runtime, executor)

    @property
    def num_clients(self) -> int:
        return self.runtime.num_clients

    @property
    def update_size(self) -> int:
        return self.runtime.spec.num_trainable

    @property
    def true_groups(self) -> np.ndarray:
        return self.runtime.data.groups

    @property
    def executor_name(self) -> str:
        return self.executor.name

    def initial_params(self) -> torch.Tensor:
        return self.runtime.initial_params()

    def run_tasks(self, rnd: int, tasks: list[TrainTask]) -> list[TrainReply]:
        return self.executor.train(tasks)

    def evaluate_models(self, models: dict[int, torch.Tensor]) -> dict[int, tuple[float, float]]:
        return self.executor.evaluate(models)

    def attack_success(self, models: dict[int, torch.Tensor], label_map: dict[int, int]
                       ) -> dict[int, tuple[int, int]]:
        return self.runtime.attack_success(models, label_map)

    def close(self) -> None:
        self.executor.close()
