"""The embedded engine: all clients on this machine, run by the fastest executor."""

from __future__ import annotations

import time
from typing import Any

from fedflock.algorithms.base import Algorithm
from fedflock.client.executors import Executor
from fedflock.client.runtime import ClientRuntime


class EmbeddedEngine:
    def __init__(self, runtime: ClientRuntime, executor: Executor) -> None:
        self.runtime = runtime
        self.executor = executor

    def train_round(self, algorithm: Algorithm, rnd: int, clients: list[int]
                    ) -> tuple[dict[str, Any], dict[str, float]]:
        """One round of training; returns (algorithm diagnostics, seconds per phase)."""
        t0 = time.perf_counter()
        tasks = algorithm.configure_train(rnd, clients)
        t1 = time.perf_counter()
        replies = self.executor.train(tasks)
        t2 = time.perf_counter()
        diagnostics = algorithm.aggregate_train(rnd, replies)
        t3 = time.perf_counter()
        losses = {r.client: r.loss for r in replies}
        diagnostics["train_loss"] = round(sum(losses.values()) / max(1, len(losses)), 6)
        return diagnostics, {"configure": t1 - t0, "train": t2 - t1, "aggregate": t3 - t2}

    def finish(self, algorithm: Algorithm, rnd: int, clients: list[int]) -> None:
        tasks = algorithm.final_tasks(rnd, clients)
        if tasks:
            algorithm.finalize(self.executor.train(tasks))

    def evaluate(self, algorithm: Algorithm) -> dict[int, tuple[float, float]]:
        models = {c: algorithm.model_of(c) for c in range(self.runtime.num_clients)}
        return self.executor.evaluate(models)

    def close(self) -> None:
        self.executor.close()
