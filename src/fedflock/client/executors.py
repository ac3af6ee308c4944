"""Executors run the training tasks of a round. They differ only in speed, never in result.

- `sequential`: a plain per-client loop (fastest for one core).
- `processes`: the clients of a round split over worker processes, one thread each. Measured on
  2 CPU cores it is close to 2x the loop once the pool exists (FINDINGS, "Executing clients").
- `batched`: `torch.func.vmap` over clients; the way to go on a GPU, 1.3-2x SLOWER than the loop
  on CPU for convolutions, so `auto` never picks it there.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from abc import ABC, abstractmethod

import torch
from torch.func import functional_call, grad, vmap

from fedflock.client.runtime import ClientRuntime
from fedflock.client.tasks import Train, released
from fedflock.client.training import batch_schedule, sgd_step
from fedflock.errors import ConfigError
from fedflock.registry import Registry
from fedflock.wire import Reply, Task


class Executor(ABC):
    """Runs the tasks of a round on a `ClientRuntime`. Every executor runs every task kind
    (`Task.run`); `accelerates` says which tasks it runs by a faster path of its own."""

    name: str

    def __init__(self, runtime: ClientRuntime, workers: int | None = None) -> None:
        self.runtime = runtime

    def accelerates(self, task: Task) -> bool:
        """Whether this executor has a path of its own for `task` (else `Task.run`)."""
        return False

    @abstractmethod
    def run(self, tasks: list[Task]) -> list[Reply]:
        """Replies in the order of `tasks`."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release workers; safe to call twice."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


EXECUTORS: Registry[type[Executor]] = Registry("executor")


@EXECUTORS.register("sequential", "one client after another in this process")
class SequentialExecutor(Executor):
    name = "sequential"

    def run(self, tasks: list[Task]) -> list[Reply]:
        return self.runtime.run(tasks)


_worker_runtime: ClientRuntime | None = None


def _worker_init() -> None:
    torch.set_num_threads(1)


def _worker_run(tasks: list[Task], states: dict[int, dict[str, torch.Tensor]]
                ) -> tuple[list[Reply], dict[int, dict[str, torch.Tensor]]]:
    """Run tasks with their clients' states as the server process holds them; return the
    replies and the states as the tasks left them."""
    assert _worker_runtime is not None
    clients = {t.client for t in tasks}
    for client in clients:
        _worker_runtime.states[client] = states.get(client, {})
    replies = _worker_runtime.run(tasks)
    return replies, {c: _worker_runtime.states.pop(c, {}) for c in clients}


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


@EXECUTORS.register("processes", "clients split over forked worker processes, one per core")
class ProcessExecutor(Executor):
    name = "processes"

    def __init__(self, runtime: ClientRuntime, workers: int | None = None) -> None:
        super().__init__(runtime)
        global _worker_runtime
        self.workers = workers or available_cores()
        _worker_runtime = runtime  # inherited by the forked workers: data is never pickled
        self._pool = mp.get_context("fork").Pool(self.workers, initializer=_worker_init)

    def _chunks(self, tasks: list[Task]) -> list[list[int]]:
        """Task positions per worker: contiguous shares when the tasks share work (clients of
        one cluster stay together; a shared model tensor is pickled once per worker, as pickle
        keeps shared objects shared), else a longest-processing-time split balanced by
        example counts."""
        if all(type(t).shares_work for t in tasks):
            share = -(-len(tasks) // self.workers)
            return [list(range(i, min(i + share, len(tasks))))
                    for i in range(0, len(tasks), share)]
        loads = [0] * self.workers
        chunks: list[list[int]] = [[] for _ in range(self.workers)]
        order = sorted(range(len(tasks)), key=lambda i: -self.runtime.num_examples(tasks[i].client))
        for i in order:
            w = loads.index(min(loads))
            chunks[w].append(i)
            loads[w] += self.runtime.num_examples(tasks[i].client)
        return [sorted(c) for c in chunks if c]

    def run(self, tasks: list[Task]) -> list[Reply]:
        if not tasks:
            return []
        chunks = self._chunks(tasks)
        states = self.runtime.states
        work = [([tasks[i] for i in c], {tasks[i].client: states[tasks[i].client] for i in c
                                         if tasks[i].client in states}) for c in chunks]
        results = self._pool.starmap(_worker_run, work)
        replies: list[Reply | None] = [None] * len(tasks)
        for positions, (chunk_replies, chunk_states) in zip(chunks, results, strict=True):
            states.update({c: s for c, s in chunk_states.items() if s or c in states})
            for i, reply in zip(positions, chunk_replies, strict=True):
                replies[i] = reply
        return replies  # type: ignore[return-value]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None


@EXECUTORS.register("batched", "all clients of a round at once with torch.func.vmap (GPU)")
class BatchedExecutor(Executor):
    name = "batched"

    def __init__(self, runtime: ClientRuntime, workers: int | None = None) -> None:
        super().__init__(runtime)
        if runtime.spec.has_buffers:
            raise ConfigError(
                "training.executor: 'batched' does not support models with BatchNorm buffers "
                f"({runtime.model_cfg.name}); use 'sequential' or 'processes'"
            )

        def loss(params: dict, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            logits = functional_call(runtime.model, params, (x,))
            ce = runtime.objective.losses(logits, y)
            return (ce * w).sum() / w.sum().clamp_min(1.0)

        self._grad = vmap(grad(loss, has_aux=False))
        self._loss = vmap(loss)

    def accelerates(self, task: Task) -> bool:
        """Plain training, unless DP-SGD needs per-sample gradients (those tasks run one by
        one, through Opacus); client-level DP noises the batched updates like any other."""
        dp = self.runtime.dp
        return isinstance(task, Train) and task.plain and not (dp is not None and dp.per_sample)

    def run(self, tasks: list[Task]) -> list[Reply]:
        rt = self.runtime
        batched = [i for i, t in enumerate(tasks) if self.accelerates(t)]
        other = [i for i, t in enumerate(tasks) if not self.accelerates(t)]
        replies: list[Reply | None] = [None] * len(tasks)
        for i, reply in zip(other, rt.run([tasks[i] for i in other]), strict=True):
            replies[i] = reply
        if batched:
            for i, reply in zip(batched, self._train_batched([tasks[i] for i in batched]),
                                strict=True):
                replies[i] = reply
        return replies  # type: ignore[return-value]

    def _train_batched(self, tasks: list[Train]) -> list[Reply]:
        rt, cfg = self.runtime, self.runtime.training
        data = [rt.client_data(t.client) for t in tasks]
        starts = torch.stack([rt.receive(t.params) for t in tasks])
        schedules = [batch_schedule(d.num_train, cfg, rt.task_seed(t, t.salt), t.epochs)
                     for t, d in zip(tasks, data, strict=True)]
        steps = max(len(s) for s in schedules)
        width = max(len(b) for s in schedules for b in s)
        names = rt.spec.names[: rt.spec.num_params]
        params = {n: v.clone() for n, v in rt.spec.split(starts).items() if n in names}
        bufs: dict[str, torch.Tensor | None] = dict.fromkeys(names)
        loss_sum = torch.zeros(len(tasks), dtype=rt.dtype)
        k = len(tasks)
        for s in range(steps):
            xs, ys, ws = [], [], []
            active = torch.tensor([s < len(sch) for sch in schedules])
            for d, sch in zip(data, schedules, strict=True):
                idx = sch[s] if s < len(sch) else sch[0]
                pad = width - len(idx)
                w = torch.ones(len(idx), dtype=rt.dtype)
                if pad:
                    idx = torch.cat([idx, idx[:1].expand(pad)])
                    w = torch.cat([w, torch.zeros(pad, dtype=rt.dtype)])
                xs.append(d.x_train[idx])
                ys.append(d.y_train[idx])
                ws.append(w * float(s < len(sch)))
            x, y, w = torch.stack(xs), torch.stack(ys), torch.stack(ws)
            grads = self._grad(params, x, y, w)
            loss_sum += self._loss(params, x, y, w).detach() * active
            for n in names:
                mask = active.view(k, *([1] * (params[n].dim() - 1)))
                new, buf = sgd_step(params[n], grads[n], bufs[n], cfg)
                params[n] = torch.where(mask, new, params[n])
                if buf is not None:
                    bufs[n] = buf if bufs[n] is None else torch.where(mask, buf, bufs[n])
        final = torch.cat([params[n].reshape(k, -1) for n in names], dim=1)
        updates = torch.zeros_like(starts)
        updates[:, : rt.spec.num_trainable] = final - starts[:, : rt.spec.num_trainable]
        counts = torch.tensor([len(sch) for sch in schedules], dtype=rt.dtype)
        return [released(rt, t, starts[i], updates[i], float(loss_sum[i] / counts[i]),
                         d.num_train, t.salt)
                for i, (t, d) in enumerate(zip(tasks, data, strict=True))]


def choose_executor(runtime: ClientRuntime, requested: str, workers: int | None) -> Executor:
    """The fastest executor for this device and model, unless the config forces one."""
    name = requested
    if name == "auto":
        if torch.cuda.is_available() and not runtime.spec.has_buffers:
            name = "batched"
        elif (workers or available_cores()) >= 2 and runtime.num_clients >= 4:
            name = "processes"
        else:
            name = "sequential"
    return EXECUTORS.get(name)(runtime, workers)
