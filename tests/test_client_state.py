"""What a client keeps between rounds is one interface (`runtime.state(client)`) with one meaning
on every engine: the embedded engine's executors (the processes executor ships it to its workers
and back) and Flower, where it lives in the node's `Context.state`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from flwr.supercore.task_identity import TaskIdentity

from fedflock.client.runtime import ClientRuntime
from fedflock.engines.embedded import EmbeddedEngine
from fedflock.engines.flower.codec import record_tensors
from fedflock.engines.flower.engine import FlowerEngine
from fedflock.engines.flower.handler import STATE
from fedflock.validation import validate
from fedflock.wire import Reply, Task, check_tensor, register_task
from tests.conftest import small_config
from tests.inprocess_grid import InProcessGrid

ROUNDS = 4


@register_task
@dataclass
class Remember(Task):
    """A toy personal model: each round the client adds what it received, scaled by its own
    first label, to what it kept, and counts its rounds; it replies with both."""

    kind = "test_remember"
    params: torch.Tensor

    def run(self, runtime: ClientRuntime) -> Reply:
        state = runtime.state(self.client)
        scale = float(runtime.client_data(self.client).y_train[0]) + 1.0
        state["personal"] = state.get("personal", torch.zeros_like(self.params)) + \
            scale * self.params
        state["rounds"] = state.get("rounds", torch.zeros(1)) + 1.0
        return Reply(self.client, {"personal": state["personal"].clone()},
                     {"rounds": float(state["rounds"])}, runtime.num_examples(self.client))

    def check(self, reply: Reply) -> None:
        check_tensor(reply, "personal", tuple(self.params.shape))
        super().check(reply)


def _play(engine, clients_per_round: list[list[int]]) -> dict[int, Reply]:
    """Run `Remember` for the given clients each round; the last reply of every client."""
    last = {}
    for rnd, clients in enumerate(clients_per_round, start=1):
        tasks = [Remember(c, rnd, torch.full((5,), float(rnd))) for c in clients]
        last.update({r.client: r for r in engine.run_tasks(rnd, tasks)})
    return last


SCHEDULE = [[0, 1, 2, 3, 4, 5], [1, 3, 5], [0, 1, 2], [1, 4, 5]]


def _expected(client: int, scale: float) -> tuple[torch.Tensor, float]:
    rounds = [rnd for rnd, clients in enumerate(SCHEDULE, start=1) if client in clients]
    return torch.full((5,), scale * sum(rounds)), float(len(rounds))


@pytest.mark.parametrize("executor", ["sequential", "processes"])
def test_state_after_n_rounds_is_the_same_on_every_engine(tmp_path: Path, executor: str) -> None:
    raw = small_config(**{"training.executor": executor, "training.workers": 2})
    cfg = validate(raw)
    embedded = EmbeddedEngine.from_config(cfg)
    try:
        on_embedded = _play(embedded, SCHEDULE)
        kept = {c: dict(s) for c, s in embedded.runtime.states.items()}
        labels = {c: float(embedded.runtime.client_data(c).y_train[0]) + 1.0
                  for c in range(cfg.data.clients)}
    finally:
        embedded.close()

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    grid = InProcessGrid(path, {100 + c: c for c in range(cfg.data.clients)})
    on_flower = _play(FlowerEngine(grid, cfg, timeout=1.0, connect_timeout=1.0), SCHEDULE)

    assert set(on_embedded) == set(on_flower) == set(range(cfg.data.clients))
    for client in range(cfg.data.clients):
        personal, rounds = _expected(client, labels[client])
        for reply in (on_embedded[client], on_flower[client]):
            assert torch.equal(reply.tensors["personal"], personal)
            assert reply.metrics["rounds"] == rounds
        # ... and what each engine holds between rounds is that same state
        node_state = record_tensors(grid.contexts[100 + client].state.array_records[STATE])
        for held in (kept[client], node_state):
            assert held.keys() == {"personal", "rounds"}
            assert torch.equal(held["personal"], personal)
            assert float(held["rounds"]) == rounds
