"""What every engine does: move tasks to clients and replies back, and nothing else.

The round logic shared by all engines lives here (ask the algorithm for tasks, run them, hand the
replies back, evaluate); an engine only says how tasks and models reach the clients.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch

from fedflock.algorithms.base import Algorithm
from fedflock.client.protocol import TrainReply, TrainTask


class Engine(ABC):
    name: str

    def __init__(self) -> None:
        self.missing: dict[int, list[int]] = {}  # client -> rounds it did not reply
        self.rejected: list[dict[str, Any]] = []  # replies refused (NaN, wrong shape, errors)

    @property
    @abstractmethod
    def num_clients(self) -> int: ...

    @property
    @abstractmethod
    def update_size(self) -> int:
        """Length of the trainable block of a parameter vector."""

    @property
    @abstractmethod
    def true_groups(self) -> np.ndarray | None:
        """Hidden group per client, for evaluation only (None when unknown)."""

    @property
    @abstractmethod
    def executor_name(self) -> str: ...

    @abstractmethod
    def initial_params(self) -> torch.Tensor: ...

    @abstractmethod
    def run_tasks(self, rnd: int, tasks: list[TrainTask]) -> list[TrainReply]:
        """Replies of the clients that answered (a subset of the tasks' clients)."""

    @abstractmethod
    def evaluate_models(self, models: dict[int, torch.Tensor]) -> dict[int, tuple[float, float]]:
        """(accuracy, loss) per client that answered."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release workers or connections."""

    def train_round(self, algorithm: Algorithm, rnd: int, clients: list[int]
                    ) -> tuple[dict[str, Any], dict[str, float]]:
        """One round of training; returns (algorithm diagnostics, seconds per phase)."""
        t0 = time.perf_counter()
        tasks = algorithm.configure_train(rnd, clients)
        t1 = time.perf_counter()
        replies = self.run_tasks(rnd, tasks)
        t2 = time.perf_counter()
        diagnostics = algorithm.aggregate_train(rnd, replies)
        t3 = time.perf_counter()
        losses = [r.loss for r in replies]
        diagnostics["train_loss"] = round(sum(losses) / max(1, len(losses)), 6)
        answered = {r.client for r in replies}
        for task in tasks:
            if task.client not in answered:
                self.missing.setdefault(task.client, []).append(rnd)
        return diagnostics, {"configure": t1 - t0, "train": t2 - t1, "aggregate": t3 - t2}

    def finish(self, algorithm: Algorithm, rnd: int, clients: list[int]) -> bool:
        """Run the algorithm's final tasks (e.g. fine-tuning); True if there were any."""
        tasks = algorithm.final_tasks(rnd, clients)
        if tasks:
            algorithm.finalize(self.run_tasks(rnd, tasks))
        return bool(tasks)

    def evaluate(self, algorithm: Algorithm) -> dict[int, tuple[float, float]]:
        return self.evaluate_models({c: algorithm.model_of(c) for c in range(self.num_clients)})
