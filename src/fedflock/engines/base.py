"""What every engine does: move tasks to clients and replies back, and nothing else.

The round logic shared by all engines lives here (ask the algorithm for tasks, run them, check and
hand the replies back, evaluate); an engine only says how tasks reach the clients.

The server trusts no reply. Before any algorithm sees one it must (1) answer a task sent to that
client, once; (2) carry only floating-point tensors of the agreed width; (3) report as many
training examples as the client declared when it joined (aggregation weights are the server's
record, a reply cannot change them); (4) pass its task's own check (`Task.check`: shapes,
finiteness, metrics); and (5) have an update norm within `norm_bound` times the median norm of
the updates computed from the same model in that round. A refused reply is logged with its
reason in `rejected` and the round goes on without it; nothing a client sends ends the run.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedflock.algorithms.base import Algorithm
from fedflock.data.spec import DataSpec
from fedflock.models import ModelHandle
from fedflock.robust import Adversary
from fedflock.wire import InvalidReply, Reply, Task

MAX_FINAL_STEPS = 32  # final task rounds (e.g. one per level of a parameter tree)
MIN_NORM_GROUP = 3  # updates from one model needed before a median norm means anything
log = logging.getLogger("fedflock.engine")


class Engine(ABC):
    name: str
    # Each message costs a process start (Flower): evaluate in the training message by default.
    pays_per_message: bool = False

    def __init__(self) -> None:
        self.missing: dict[int, list[int]] = {}  # client -> rounds it did not reply
        self.rejected: list[dict[str, Any]] = []  # replies refused (NaN, wrong shape, errors)
        self.adversary: Adversary | None = None  # model poisoning by malicious clients
        self.communication = {"down_floats": 0, "up_floats": 0}
        self.declared: dict[int, int] = {}  # client -> training examples declared on joining
        self.dtype = torch.float32  # the agreed type of every tensor exchanged
        self.norm_bound: float | None = None  # refuse updates beyond this x the median norm

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
    def data_spec(self) -> DataSpec: ...

    @property
    def tokenizer(self) -> str | None:
        """The JSON of the tokenizer the clients' text was cut with (None: not text, or not
        known to this engine); the run keeps it as `tokenizer.json`."""
        return None

    @property
    def data_source(self) -> str | None:
        """Which file(s) the federation was read from, in one line, where a dataset has a
        choice (AG News: train.csv or test.csv) and this engine sees the data."""
        return None

    @property
    @abstractmethod
    def executor_name(self) -> str: ...

    @abstractmethod
    def initial_models(self, count: int) -> torch.Tensor:
        """`count` distinct agreed initial models (K, P), as the server holds them (masked when
        the clients mask); the first row is the run's initial model."""

    @abstractmethod
    def model_handle(self) -> ModelHandle | None:
        """Build/describe the model behind the vectors; None when the clients mask them."""

    @abstractmethod
    def run_tasks(self, rnd: int, tasks: list[Task]) -> list[Reply]:
        """Replies of the clients that answered (a subset of the tasks' clients); replies that
        could not even be decoded are refused here (`refuse`)."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release workers or connections."""

    def attack_success(self, models: dict[int, torch.Tensor], label_map: dict[int, int]
                       ) -> dict[int, tuple[int, int]] | None:
        """Per client (targeted test samples classified as the attacker's target, targeted test
        samples); None where the engine cannot see client data (Flower)."""
        return None

    # -- the shared round logic --------------------------------------------------------------
    def refuse(self, rnd: int, client: int | None, reason: str, **where: Any) -> None:
        self.rejected.append({"round": rnd, "client": client, "reason": reason, **where})
        who = f"client {client}" if client is not None else ", ".join(
            f"{k} {v}" for k, v in where.items())
        log.warning("round %d: refused the reply of %s: %s", rnd, who, reason)

    def check_reply(self, task: Task, reply: Reply) -> None:
        """What every reply must satisfy, whatever its task: agreed tensor types, the declared
        example count, then the task's own check. Raises InvalidReply."""
        for name, value in reply.tensors.items():
            if not isinstance(value, torch.Tensor) or value.dtype != self.dtype:
                kind = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
                raise InvalidReply(f"{name!r} has type {kind}, the agreed {self.dtype}")
        count = reply.num_examples
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidReply(f"num_examples {count!r} is not a count")
        declared = self.declared.get(reply.client)
        if task.counts_training_examples and declared is not None and count != declared:
            raise InvalidReply(f"reports {count} training examples, declared {declared} on "
                               "joining")
        task.check(reply)

    def accept(self, rnd: int, tasks: list[Task], replies: list[Reply]) -> list[Reply]:
        """The replies that pass every check (one per task's client); the others are refused."""
        by_client = {t.client: t for t in tasks}
        kept: dict[int, Reply] = {}
        for reply in replies:
            task = by_client.get(reply.client)
            if task is None or reply.client in kept:
                self.refuse(rnd, reply.client, "a reply to no task" if task is None
                            else "a second reply to one task")
                continue
            try:
                self.check_reply(task, reply)
            except InvalidReply as err:
                self.refuse(rnd, reply.client, str(err))
                continue
            kept[reply.client] = reply
        return self.bound_norms(rnd, by_client, list(kept.values()))

    def bound_norms(self, rnd: int, tasks: dict[int, Task], replies: list[Reply]
                    ) -> list[Reply]:
        """Refuse a reply when any update it carries (`Task.updates`: one for a trained model,
        one per component for a mixture) has a norm beyond `norm_bound` times the median norm
        of the updates computed from the same model this round (groups of at least
        MIN_NORM_GROUP): a finite 1e38 must not reach an average. Off when `norm_bound` is
        None."""
        if self.norm_bound is None:
            return replies
        groups: dict[Any, list[tuple[Reply, float]]] = {}
        for reply in replies:
            for base, update in tasks[reply.client].updates(reply):
                norm = float(torch.linalg.vector_norm(update, dtype=torch.float64))
                groups.setdefault(base, []).append((reply, norm))
        refused: set[int] = set()
        for group in groups.values():
            if len(group) < MIN_NORM_GROUP:
                continue
            median = float(np.median([norm for _, norm in group]))
            if median <= 0:
                continue
            for reply, norm in group:
                if norm > self.norm_bound * median and reply.client not in refused:
                    refused.add(reply.client)
                    self.refuse(rnd, reply.client, f"update norm {norm:.4g} exceeds "
                                f"{self.norm_bound:g} x the median {median:.4g} of its cluster")
        return [r for r in replies if r.client not in refused]

    def run_together(self, rnd: int, lists: list[list[Task]]) -> list[list[Reply]]:
        """The replies to each list of tasks, where every list holds at most one task per
        client and a client may have a task in several (an evaluation of the model it receives
        and its training). An engine that pays per message (Flower) sends a client's
        tasks as one message; here they simply run."""
        return [self.run_tasks(rnd, tasks) if tasks else [] for tasks in lists]

    def exchange(self, rnd: int, tasks: list[Task]) -> list[Reply]:
        """Send tasks, collect the replies (malicious ones poisoned on their way: the server
        checks what arrives), keep those their task accepts, count floats each way (every
        tensor of every task and accepted reply) and the clients that did not answer."""
        return self.settle(rnd, tasks, self.run_tasks(rnd, tasks))

    def settle(self, rnd: int, tasks: list[Task], replies: list[Reply]) -> list[Reply]:
        """`exchange` once the replies are in."""
        if self.adversary is not None:
            replies = self.adversary(rnd, replies)
        replies = self.accept(rnd, tasks, replies)
        self.communication["down_floats"] += sum(t.num_floats for t in tasks)
        self.communication["up_floats"] += sum(r.num_floats for r in replies)
        answered = {r.client for r in replies}
        for task in tasks:
            if task.client not in answered:
                self.missing.setdefault(task.client, []).append(rnd)
        return replies

    def train_round(self, algorithm: Algorithm, rnd: int, clients: list[int],
                    evaluate: bool = False
                    ) -> tuple[dict[str, Any], dict[str, float], dict[int, dict[str, float]]]:
        """One round of training; returns (algorithm diagnostics, seconds per phase, the
        evaluation). With `evaluate`, every client given a task first scores the model the
        server holds for it as the round begins (`evaluation_task`: the model it receives) on its
        held-out data, in the same message as its task; otherwise the evaluation is empty."""
        t0 = time.perf_counter()
        tasks = algorithm.configure_train(rnd, clients)
        t1 = time.perf_counter()
        evals: list[Task] = [algorithm.evaluation_task(t.client, rnd)
                             for t in tasks] if evaluate else []
        scored, replies = self.run_together(rnd, [evals, tasks])
        evaluation = self.scores(rnd, evals, scored) if evaluate else {}
        replies = self.settle(rnd, tasks, replies)
        t2 = time.perf_counter()
        diagnostics = algorithm.aggregate_train(rnd, replies)
        t3 = time.perf_counter()
        losses = [r.loss for r in replies if "loss" in r.metrics]
        if losses:  # none under differential privacy: the loss stays on the clients
            diagnostics["train_loss"] = round(sum(losses) / len(losses), 6)
        if algorithm.kept:
            diagnostics["kept_models"], algorithm.kept = algorithm.kept, []
        return (diagnostics, {"configure": t1 - t0, "train": t2 - t1, "aggregate": t3 - t2},
                evaluation)

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

    def evaluate(self, algorithm: Algorithm, rnd: int = 0,
                 task_of: Callable[[int, int], Task] | None = None
                 ) -> dict[int, dict[str, float]]:
        """Named metrics of every client that answered, each scored on its own held-out data
        as its method scores it (`algorithm.evaluation_task`, or `task_of` for an alternative
        evaluation). Evaluation is the experimenter's measurement: it is not counted as
        communication."""
        task_of = task_of or algorithm.evaluation_task
        tasks = [task_of(c, rnd) for c in range(self.num_clients)]
        return self.scores(rnd, tasks, self.run_tasks(rnd, tasks))

    def scores(self, rnd: int, tasks: list[Task], replies: list[Reply]
               ) -> dict[int, dict[str, float]]:
        """The metrics of the evaluation replies that pass every check, by client."""
        replies = self.accept(rnd, tasks, replies)
        return {r.client: r.metrics for r in sorted(replies, key=lambda r: r.client)}
