"""The wire vocabulary: what a server may ask of a client, and what comes back.

The bottom of the layers: server logic (`algorithms/`, `clustering/`, `robust/`), the engines
and the clients all speak it, and it imports none of them.

A task is a small dataclass registered by name (`TASKS`): its tensor fields travel to the client,
its scalar fields are options. `run(runtime)` does the work on the client's own data and returns a
generic `Reply` (named tensors, named metrics, example count); `check(reply)` is the server's
validation of that reply (shapes, dtype, finiteness). Engines, executors and the Flower codec move
any task without knowing its kind, so a new method adds a task class and touches none of them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import torch

from fedflock.registry import Registry

Scalar = int | float | str | bool
# What a task runs on: a `fedflock.client.runtime.ClientRuntime` (the client's data, model and
# training routines); named here without importing the client layer.
ClientSide = Any


class InvalidReply(ValueError):
    """A reply the server refuses (the reason is logged; the run goes on without it)."""


@dataclass
class Reply:
    """What a client sends back: named tensors, named metrics and how many examples it used."""

    client: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    num_examples: int = 0

    # The names most server logic reads, as properties (a reply need not have them).
    @property
    def update(self) -> torch.Tensor:
        return self.tensors["update"]

    @property
    def loss(self) -> float:
        return float(self.metrics.get("loss", math.nan))

    @property
    def choice(self) -> int | None:
        value = self.metrics.get("choice")
        return None if value is None else int(value)

    def with_tensors(self, **tensors: torch.Tensor) -> Reply:
        """A copy with some tensors replaced (e.g. a poisoned update)."""
        return dataclasses.replace(self, tensors={**self.tensors, **tensors})

    @property
    def num_floats(self) -> int:
        return sum(int(t.numel()) for t in self.tensors.values())


@dataclass
class Task:
    """One request to one client in one round. Subclasses add tensor fields and options."""

    kind: ClassVar[str]
    # Tasks whose `run_many` shares work between clients (one pass per shared model): executors
    # keep neighbours together instead of balancing them one by one.
    shares_work: ClassVar[bool] = False
    # A reply's example count is the client's training-set size (checked against what it
    # declared on joining); tasks over other data (held-out, server probes) say False.
    counts_training_examples: ClassVar[bool] = True
    client: int
    round: int

    # -- what travels ------------------------------------------------------------------------
    def tensors(self) -> dict[str, torch.Tensor]:
        """The task's tensors (fields holding a tensor), sent to the client."""
        return {f.name: v for f in self._fields() if isinstance(v := getattr(self, f.name),
                                                             torch.Tensor)}

    def options(self) -> dict[str, Scalar]:
        """The task's scalar options (None means the default and is not sent)."""
        return {f.name: v for f in self._fields()
                if not isinstance(v := getattr(self, f.name), torch.Tensor) and v is not None}

    @classmethod
    def from_parts(cls, client: int, round: int, tensors: dict[str, torch.Tensor],
                   options: dict[str, Scalar]) -> Task:
        """Rebuild a task from what travelled (the Flower codec's inverse of the two above)."""
        names = {f.name for f in cls._fields()}
        unknown = (set(tensors) | set(options)) - names
        if unknown:
            raise ValueError(f"task {cls.kind!r} has no field {sorted(unknown)[0]!r}")
        return cls(client=client, round=round, **options, **tensors)

    @classmethod
    def _fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.name not in ("client", "round")]

    @property
    def num_floats(self) -> int:
        return sum(int(t.numel()) for t in self.tensors().values())

    # -- what a client does ------------------------------------------------------------------
    def run(self, runtime: ClientSide) -> Reply:
        raise NotImplementedError

    @classmethod
    def run_many(cls, runtime: ClientSide, tasks: Sequence[Task]) -> list[Reply]:
        """Several tasks of this kind on one runtime (a kind may share work between them)."""
        return [t.run(runtime) for t in tasks]

    # -- what the server accepts ---------------------------------------------------------------
    def updates(self, reply: Reply) -> list[tuple[Hashable, torch.Tensor]]:
        """Every update the reply carries, each with what it was computed from (e.g. the
        identity of the model sent, and its row when several were), so the server compares
        each norm with those of the updates from the same model (`norm_bound`); none by
        default. A task whose reply carries updates must declare them all here."""
        return []

    def check(self, reply: Reply) -> None:
        """Raise `InvalidReply` unless `reply` is a well-formed answer to this task."""
        if reply.client != self.client:
            raise InvalidReply(f"reply claims client {reply.client}")
        for name, value in reply.metrics.items():
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise InvalidReply(f"metric {name!r} is not a finite number ({value!r})")


TASKS: Registry[type[Task]] = Registry("client task")


TaskType = TypeVar("TaskType", bound=type[Task])


def register_task(cls: TaskType) -> TaskType:
    """Class decorator: register a task under its `kind`, a Python identifier without `__`
    (Flower message types are `train.<identifier>`, and one message joins the kinds of its
    tasks with `__`)."""
    if not cls.kind.isidentifier() or "__" in cls.kind:
        raise ValueError(f"task kind {cls.kind!r}: use a Python identifier without '__'")
    TASKS.register(cls.kind)(cls)
    return cls


def check_tensor(reply: Reply, name: str, shape: Sequence[int] | None = None) -> torch.Tensor:
    """The named tensor of a reply, refused unless it has this shape and is finite floating
    point (the engine checks the agreed width)."""
    value = reply.tensors.get(name)
    if value is None:
        raise InvalidReply(f"reply without {name!r}")
    if not value.is_floating_point():
        raise InvalidReply(f"{name!r} has dtype {value.dtype}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise InvalidReply(f"{name!r} of shape {tuple(value.shape)}, expected {tuple(shape)}")
    if not torch.isfinite(value).all():
        raise InvalidReply(f"{name!r} contains NaN or Inf")
    return value


def check_metrics(reply: Reply, names: Iterable[str]) -> None:
    missing = [n for n in names if n not in reply.metrics]
    if missing:
        raise InvalidReply(f"reply without metric {missing[0]!r}")


class Newcomer(Protocol):
    """A client joining a trained run, as a method's router questions it (`fedflock assign`):
    its update at a given model (the trainable part, one row), or its reply to any task."""

    id: int

    def update_at(self, params: torch.Tensor) -> torch.Tensor: ...

    def run(self, task: Task) -> Reply: ...
