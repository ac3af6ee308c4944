"""Server logic of a federated algorithm, independent of any engine.

An engine asks `configure_train` what each sampled client must do (a list of client tasks),
runs the tasks, hands the checked replies to `aggregate_train`, and evaluates every client on
`model_of(client)`. Algorithms see flat parameter vectors (see `fedflock.models.flat`); the first
`update_size` entries of an update are the trainable part used for similarity and norms. All an
algorithm may know of the federation comes through its `AlgorithmContext`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from fedflock.client.tasks import Evaluate
from fedflock.data.spec import DataSpec
from fedflock.models import ModelHandle
from fedflock.wire import Reply, Task

log = logging.getLogger("fedflock.algorithm")
MAX_SAVED_MATRIX = 2000  # clients: larger similarity matrices are not kept for splits/


class AlgorithmParams(BaseModel):
    """Base of every algorithm's parameters: an unknown key or a non-finite number is a config
    error, never a silent default or an infinite threshold."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    # What the parameters control (title -> field names), for `fedflock list --params` and
    # the method pages; a subclass adds groups or names to an inherited one; a field in no
    # group is listed under "other".
    field_groups: ClassVar[dict[str, tuple[str, ...]]] = {}

    def thresholds(self) -> list[dict[str, Any]]:
        """The decision thresholds a report can draw: `statistic` (a per-cluster round figure
        such as `pseudo_f` or `mean_norm`), `value` and `label`; none by default."""
        return []


NoParams = AlgorithmParams


@dataclass
class AlgorithmContext:
    """What an algorithm may know: the number of clients, the agreed initial model (and K
    distinct ones on request), a seeded RNG, and a handle on the model (None under masking: the
    server cannot tell which coordinate is which). `true_groups` is given only to algorithms
    that declare `uses_ground_truth` (evaluation references such as the oracle)."""

    num_clients: int
    initial: torch.Tensor
    update_size: int
    seed: int = 0
    model: ModelHandle | None = None
    data_spec: DataSpec | None = None  # what a sample is (shape, classes, objective)
    dataset: str = ""  # its name, for errors that must say which data a method cannot use
    make_initial_models: Callable[[int], torch.Tensor] | None = None
    true_groups: np.ndarray | None = None
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng([self.seed, 11])

    def initial_models(self, count: int) -> torch.Tensor:
        """`count` distinct seeded initial models (K, P); the first is `initial`."""
        if count == 1 or self.make_initial_models is None:
            if count > 1:
                raise ValueError("this federation cannot make distinct initial models")
            return self.initial[None].clone()
        return self.make_initial_models(count)


@dataclass
class Cluster:
    id: int
    members: list[int]
    params: torch.Tensor


@dataclass
class Decision:
    """One structural decision (a split, a merge, a clustering, a placement): which cluster(s)
    it changed into which, the members of each result, and the statistics that decided it.
    `matrix` (client ids, similarity) is written to the run's splits/ folder when given."""

    kind: str
    round: int
    parent: int | list[int] | None
    children: list[int]
    members: list[list[int]]
    figures: dict[str, Any] = field(default_factory=dict)
    matrix: tuple[list[int], np.ndarray] | None = None

    def __post_init__(self) -> None:  # the members at decision time, not as clusters grow
        self.members = [list(m) for m in self.members]
        taken = set(self._record()).intersection(self.figures)
        if taken:  # a figure would overwrite the record itself (reports read these keys)
            raise ValueError(f"decision figures {sorted(taken)} clash with the record's keys")

    def _record(self) -> dict[str, Any]:
        return {"kind": self.kind, "round": self.round, "parent": self.parent,
                "children": self.children, "sizes": [len(m) for m in self.members],
                "members": self.members}

    def as_dict(self) -> dict[str, Any]:
        return self._record() | self.figures

    def to_state(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Decision:
        matrix = state.get("matrix")
        if matrix is not None:  # stored as a tensor (checkpoints hold no numpy objects)
            matrix = (list(matrix[0]), np.asarray(matrix[1]))
        return cls(**{**state, "matrix": matrix})


def finite_sum(model: torch.Tensor, update: torch.Tensor) -> torch.Tensor | None:
    """`model + update` in the model's dtype, or None when that is not finite."""
    new = model + update.to(model.dtype)
    return new if bool(torch.isfinite(new).all()) else None


class Algorithm(ABC):
    name: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = NoParams
    needs_model: ClassVar[bool] = False  # needs `context.model` (refuses masking)
    # Updates each client releases after the last round (`final_tasks`), counted by the
    # differential-privacy accounting beside one per round.
    final_releases: ClassVar[int] = 0
    uses_ground_truth: ClassVar[bool] = False  # an evaluation reference, not a method
    # The keys this class adds to `state_dict`; a checkpoint must hold exactly those of the
    # class and its bases (`state_keys`), or loading it fails.
    state_fields: ClassVar[tuple[str, ...]] = ("decisions",)

    def __init__(self, params: BaseModel, context: AlgorithmContext) -> None:
        self.params = params
        self.context = context
        self.num_clients = context.num_clients
        self.update_size = context.update_size
        self.decisions: list[Decision] = []
        self.kept: list[str] = []  # models kept this round because their aggregate overflowed

    @classmethod
    def newcomer_clusters(cls, state: dict[str, Any]
                          ) -> list[tuple[int, torch.Tensor, list[int]]] | None:
        """The models a client new to a finished run may join, from its checkpoint's state:
        (cluster id, parameters, members). None: the method keeps no shared model to join
        (`fedflock assign`)."""
        return None

    @classmethod
    def newcomer_router(cls, state: dict[str, Any], params: BaseModel) -> Any | None:
        """What places a new client, from the checkpoint's state and the run's parameters: an
        object whose `route(client)` questions the client (`fedflock.wire.Newcomer`: its
        updates, as CFL's parameter tree, or any task's reply, as PACFL's bases) and returns
        (cluster id, how it decided). None: a new client picks among `newcomer_clusters` by
        `newcomer_criterion`."""
        return None

    @classmethod
    def newcomer_criterion(cls, params: BaseModel) -> str:
        """How a new client picks among `newcomer_clusters` on its own training data (a select
        task's criterion): the most accurate model, as incremental clustering's newcomers."""
        return "accuracy"

    @classmethod
    def newcomer_finetune(cls, params: BaseModel) -> int | None:
        """Local epochs a new client trains the model it joined before using it, as the method's
        own clients do at the end of a run (fine-tuning); None: it uses the model as it is."""
        return None

    def participants(self, rnd: int, sampled: list[int]) -> list[int]:
        """The clients asked in round `rnd`, given the run's sample: the sample by default; a
        method that must hear from other clients (PACFL's one-shot bases: all of them) says
        so here."""
        return sampled

    @abstractmethod
    def configure_train(self, rnd: int, clients: list[int]) -> list[Task]:
        """Tasks for the clients sampled in round `rnd`."""

    @abstractmethod
    def aggregate_train(self, rnd: int, replies: list[Reply]) -> dict[str, Any]:
        """Update models/clusters from the replies; return round diagnostics (JSON-friendly)."""

    @abstractmethod
    def model_of(self, client: int) -> torch.Tensor:
        """The model `client` uses for evaluation: its cluster's, a mixture or a personal one
        (clients of a cluster share one tensor)."""

    def evaluation_task(self, client: int, rnd: int) -> Task:
        """How `client` is scored on its held-out data: its `model_of` by default; a method
        whose clients predict with several models (a mixture, an ensemble) sends them all
        (`EvaluateMixture`)."""
        return Evaluate(client, rnd, self.model_of(client))

    def alternative_evaluations(self) -> dict[str, Callable[[int, int], Task]]:
        """Other ways to score a client, reported beside the headline after the last round
        (summary.json's `alternatives`): name -> (client, round) -> evaluation task; e.g. an
        ensemble method's hard assignment. None by default."""
        return {}

    @abstractmethod
    def clusters(self) -> list[list[int]]:
        """The current hard partition of all clients (what ARI scores)."""

    def memberships(self) -> np.ndarray | None:
        """Soft membership (clients x clusters, rows sum to 1) for methods that have one."""
        return None

    def num_clusters(self) -> int:
        """Clusters with a model of their own (clients waiting to be placed form none)."""
        return len(self.clusters())

    def unplaced(self) -> list[int]:
        """Clients that belong to no cluster yet (partial participation); none by default."""
        return []

    @classmethod
    def releases(cls, params: BaseModel, rounds: int) -> int:
        """Updates each client may release over a run, for differential-privacy accounting:
        one per round plus `final_releases`."""
        return rounds + cls.final_releases

    def final_tasks(self, rnd: int, clients: list[int]) -> list[Task]:
        """Extra tasks after the last round (e.g. fine-tuning); none by default."""
        return []

    def finalize(self, replies: list[Reply]) -> None:  # noqa: B027 (optional hook)
        """Consume the replies of `final_tasks`."""

    def tree(self) -> list[dict[str, Any]] | None:
        return None

    def thresholds(self) -> list[dict[str, Any]]:
        """The decision thresholds a report can draw (`AlgorithmParams.thresholds`)."""
        params = self.params
        return params.thresholds() if isinstance(params, AlgorithmParams) else []

    def step(self, model: torch.Tensor, update: torch.Tensor, what: str) -> torch.Tensor:
        """`model + update`, or `model` unchanged when that is not finite: an aggregate that
        overflowed never replaces a model (the cause is logged and reported in the round's
        record as `kept_models`)."""
        new = finite_sum(model, update)
        if new is not None:
            return new
        self.kept.append(what)
        log.warning("%s: the aggregate is not finite; the previous model is kept", what)
        return model

    def record(self, decision: Decision) -> None:
        """Keep a decision; its matrix only up to MAX_SAVED_MATRIX clients (O(n^2) bytes)."""
        if decision.matrix is not None and len(decision.matrix[0]) > MAX_SAVED_MATRIX:
            decision.matrix = None
        self.decisions.append(decision)

    def take_matrices(self) -> list[tuple[int, list[int], np.ndarray]]:
        """(decision index, client ids, similarity) of the decisions still holding a matrix,
        which they then forget: the run writes each to splits/ once, so neither memory nor
        checkpoints grow with them."""
        out = []
        for index, decision in enumerate(self.decisions):
            if decision.matrix is not None:
                out.append((index, *decision.matrix))
                decision.matrix = None
        return out

    @classmethod
    def state_keys(cls) -> set[str]:
        """Every key of the state: the `state_fields` of the class and its bases."""
        return {key for klass in cls.__mro__ for key in vars(klass).get("state_fields", ())}

    def state_dict(self) -> dict[str, Any]:
        return {"decisions": [d.to_state() for d in self.decisions]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`; a key missing or unknown is a ValueError, never a default
        (every override calls this first)."""
        expected, got = self.state_keys(), set(state)
        if got != expected:
            wrong = [f"{what} {sorted(keys)}" for what, keys in
                     (("missing", expected - got), ("unknown", got - expected)) if keys]
            raise ValueError(f"{self.name} state: {'; '.join(wrong)}")
        self.decisions = [Decision.from_state(d) for d in state["decisions"]]
