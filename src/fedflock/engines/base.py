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
from fedflock.robust import Adversary

MAX_FINAL_STEPS = 32  # final task rounds (e.g. one per level of a parameter tree)


class Engine(ABC):
    name: str

    def __init__(self) -> None:
        self.missing: dict[int, list[int]] = {}  # client -> rounds it did not reply
        self.rejected: list[dict[str, Any]] = []  # replies refused (NaN, wrong shape, errors)
        self.adversary: Adversary | None = None  # model poisoning by malicious clients
        self.communication = {"down_floats": 0, "up_floats": 0}

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

    def attack_success(self, models: dict[int, torch.Tensor], label_map: dict[int, int]
                       ) -> dict[int, tuple[int, int]] | None:
        """Per client (targeted test samples classified as the attacker's target, targeted test
        samples); None where the engine cannot see client data (Flower)."""
        return None

    def exchange(self, rnd: int, tasks: list[TrainTask]) -> list[TrainReply]:
        """Send tasks, collect replies (malicious ones poisoned), count floats each way and the
        clients that did not answer."""
        replies = self.run_tasks(rnd, tasks)
        if self.adversary is not None:
            replies = self.adversary(rnd, replies)
        self.communication["down_floats"] += sum(int(t.params.numel()) for t in tasks)
        self.communication["up_floats"] += sum(
            int(r.update.numel()) + (0 if r.payload is None else int(r.payload.numel()))
            for r in replies)
        answered = {r.client for r in replies}
        for task in tasks:
            if task.client not in answered:
                self.missing.setdefault(task.client, []).append(rnd)
        return replies

    def train_round(self, algorithm: Algorithm, rnd: int, clients: list[int]
                    ) -> tuple[dict[str, Any], dict[str, float]]:
        """One round of training; returns (algorithm diagnostics, seconds per phase)."""
        t0 = time.perf_counter()
        tasks = algorithm.configure_train(rnd, clients)
        t1 = time.perf_counter()
        replies = self.exchange(rnd, tasks)
        t2 = time.perf_counter()
        diagnostics = algorithm.aggregate_train(rnd, replies)
        t3 = time.perf_counter()
        losses = [r.loss for r in replies]
        diagnostics["train_loss"] = round(sum(losses) / max(1, len(losses)), 6)
        return diagnostics, {"configure": t1 - t0, "train": t2 - t1, "aggregate": t3 - t2}

    def finish(self, algorithm: Algorithm, rnd: int, clients: list[int]) -> bool:
        """Run the algorithm's final tasks (fine-tuning, placing the clients it has not placed
        yet) until it asks for none; True if there were any."""
        ran = False
        for _ in range(MAX_FINAL_STEPS):
            tasks = algorithm.final_tasks(rnd, clients)
            if not tasks:
                break
            replies = self.exchange(rnd, tasks)
            algorithm.finalize(replies)
            ran = True
            if not replies:  # nobody left who answers: asking again would not help
                break
        return ran

    def evaluate(self, algorithm: Algorithm) -> dict[int, tuple[float, float]]:
        return self.evaluate_models({c: algorithm.model_of(c) for c in range(self.num_clients)})
