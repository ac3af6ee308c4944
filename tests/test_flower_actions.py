"""The ClientApp's handlers, called in-process with real Flower Messages (no processes needed):
the default train/evaluate/query and the custom `train.<action>` tasks other algorithms use."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedflock.client.protocol import TrainTask
from fedflock.client.runtime import ClientRuntime
from fedflock.config import validate
from fedflock.data.scenarios import build_federated_data
from fedflock.engines.flower.clientapp import app
from fedflock.engines.flower.codec import (
    PARAMS,
    record_vector,
    reply_from_message,
    task_content,
    vector_record,
)
from tests.conftest import small_config


@pytest.fixture(autouse=True)
def _task_identity() -> None:
    """Replies need the identity a SuperNode gives its ClientApp process."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 7


def _output(answer: Message, key: str) -> torch.Tensor:
    return torch.from_numpy(answer.content.array_records["outputs"][key].numpy().copy())


def _setup(tmp_path: Path, client: int = 1) -> tuple[Context, ClientRuntime]:
    raw = small_config()
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    context = Context(run_id=1, node_id=7, node_config={"partition-id": client},
                      state=RecordDict(), run_config={"config": str(path)})
    cfg = validate(raw)
    runtime = ClientRuntime(build_federated_data(cfg.data, cfg.seed), cfg.model, cfg.training,
                            cfg.seed)
    return context, runtime


def _send(content: RecordDict, kind: str, context: Context) -> Message:
    return app(Message(content, 7, kind), context)


def _inputs(**arrays: torch.Tensor) -> RecordDict:
    record = ArrayRecord()
    for key, value in arrays.items():
        record[key] = vector_record(key, value)[key]
    return RecordDict({"inputs": record})


def test_train_and_evaluate_messages_match_the_runtime(tmp_path: Path) -> None:
    context, runtime = _setup(tmp_path)
    start = runtime.initial_params()
    task = TrainTask(1, start, round=2)
    reply = reply_from_message(_send(task_content(task), "train", context), start.numel(), 1)
    assert torch.equal(reply.update, runtime.train(task).update)
    answer = _send(RecordDict({PARAMS: vector_record(PARAMS, start)}), "evaluate", context)
    metrics = answer.content.metric_records["metrics"]
    assert metrics["accuracy"] == runtime.evaluate({1: start})[1][0]


def test_select_task_round_trips_scores_and_choice(tmp_path: Path) -> None:
    """A select task (K models) through the ClientApp equals the runtime's own answer."""
    context, runtime = _setup(tmp_path)
    start = runtime.initial_params()
    trained = start + runtime.train(TrainTask(1, start, round=1, epochs=3)).update
    task = TrainTask(1, torch.stack([start, trained]), round=2, mode="select")
    reply = reply_from_message(_send(task_content(task), "train", context), start.numel(), 1)
    local = runtime.train(task)
    assert reply.choice == local.choice == 1  # the trained model fits the client's data better
    assert torch.equal(reply.payload, local.payload) and reply.payload.shape == (2, 2)
    assert torch.equal(reply.update, local.update)


def test_query_reports_partition_group_and_initial_model(tmp_path: Path) -> None:
    context, runtime = _setup(tmp_path)
    ask = RecordDict({"ask": ConfigRecord({"initial-params": 1})})
    info = _send(ask, "query", context).content
    assert info.config_records["info"]["client"] == 1
    assert info.config_records["info"]["group"] == int(runtime.data.groups[1])
    assert torch.equal(record_vector(info, PARAMS), runtime.initial_params())


def test_custom_actions_answer_losses_bases_and_responses(tmp_path: Path) -> None:
    context, runtime = _setup(tmp_path)
    models = torch.stack([runtime.initial_params(), runtime.initial_params() * 0.5])
    losses = _output(_send(_inputs(models=models), "train.losses", context), "losses")
    assert losses.shape == (2,) and torch.allclose(losses, runtime.losses(1, models))
    content = RecordDict({"config": ConfigRecord({"rank": 3})})
    u = _output(_send(content, "train.basis", context), "basis")
    assert u.shape == (64, 3)
    assert torch.allclose(u.T @ u, torch.eye(3, dtype=u.dtype), atol=1e-5)  # orthonormal
    inputs = torch.rand(5, 1, 8, 8)
    message = _inputs(params=models[0], inputs=inputs)
    probs = _output(_send(message, "train.responses", context), "responses")
    assert probs.shape == (5, 10) and torch.allclose(probs.sum(1), torch.ones(5), atol=1e-5)
