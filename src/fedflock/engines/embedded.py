"""The embedded engine: all clients on this machine, run by the fastest executor."""

from __future__ import annotations

import numpy as np
import torch

from fedflock.client.executors import Executor, choose_executor
from fedflock.client.runtime import ClientRuntime
from fedflock.client.tasks import attack_success
from fedflock.config import ExperimentConfig
from fedflock.data.scenarios import build_federated_data
from fedflock.data.spec import DataSpec
from fedflock.engines.base import Engine
from fedflock.models import ModelHandle
from fedflock.wire import Reply, Task


class EmbeddedEngine(Engine):
    name = "embedded"

    def __init__(self, runtime: ClientRuntime, executor: Executor) -> None:
        super().__init__()
        self.runtime = runtime
        self.executor = executor
        self.dtype = runtime.dtype
        self.declared = {c: runtime.num_examples(c) for c in range(runtime.num_clients)}

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
    def data_spec(self) -> DataSpec:
        return self.runtime.data_spec

    @property
    def tokenizer(self) -> str | None:
        return self.runtime.data.tokenizer

    @property
    def data_source(self) -> str | None:
        return self.runtime.data.source

    @property
    def executor_name(self) -> str:
        return self.executor.name

    def initial_models(self, count: int) -> torch.Tensor:
        return self.runtime.initial_models(count)

    def model_handle(self) -> ModelHandle | None:
        return None if self.runtime.mask is not None else self.runtime.model_handle()

    def run_tasks(self, rnd: int, tasks: list[Task]) -> list[Reply]:
        return self.executor.run(tasks)

    def attack_success(self, models: dict[int, torch.Tensor], label_map: dict[int, int]
                       ) -> dict[int, tuple[int, int]]:
        return attack_success(self.runtime, models, label_map)

    def close(self) -> None:
        self.executor.close()
