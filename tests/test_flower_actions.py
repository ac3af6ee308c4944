"""The ClientApp's one generic handler, called in-process with real Flower Messages (no
processes needed): every built-in task through the codec equals the task run on the runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedflock.client.runtime import ClientRuntime
from fedflock.client.tasks import Basis, Evaluate, Gradient, Losses, Responses, Select, Train
from fedflock.data.scenarios import build_federated_data
from fedflock.engines.flower.clientapp import app
from fedflock.engines.flower.codec import (
    message_type,
    record_tensors,
    replies_from_message,
    task_content,
)
from fedflock.validation import validate
from fedflock.wire import InvalidReply, Task
from tests.conftest import small_config


@pytest.fixture(autouse=True)
def _task_identity() -> None:
    """Replies need the identity a SuperNode gives its ClientApp process."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 7


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


def _send(task: Task, context: Context) -> Message:
    return app(Message(task_content([task]), 7, message_type([task])), context)


def _tasks(runtime: ClientRuntime) -> list[Task]:
    start = runtime.initial_params()
    trained = start + Train(1, 1, start, epochs=3).run(runtime).update
    models = torch.stack([start, trained])
    n = runtime.num_examples(1)
    return [Train(1, 2, start),
            Train(1, 2, start, proximal_mu=0.1, sample_weights=torch.rand(n)),
            Train(1, 2, start, proximal_mu=0.1, centres=models,
                  centre_weights=torch.tensor([0.3, 0.7])),
            Gradient(1, 2, start),
            Select(1, 2, models), Select(1, 2, models, criterion="accuracy", train=False),
            Losses(1, 2, models), Basis(1, 2, rank=3), Evaluate(1, 2, trained),
            Responses(1, 2, start, torch.rand(5, 1, 8, 8))]


def test_every_task_through_the_clientapp_equals_the_runtime(tmp_path: Path) -> None:
    context, runtime = _setup(tmp_path)
    for task in _tasks(runtime):
        (reply,) = replies_from_message(_send(task, context), 1, 1)
        task.check(reply)
        local = task.run(runtime)
        assert reply.tensors.keys() == local.tensors.keys(), task.kind
        for name, value in local.tensors.items():
            assert torch.equal(reply.tensors[name], value), (task.kind, name)
        assert reply.metrics == pytest.approx(local.metrics), task.kind
        assert reply.num_examples == local.num_examples


def test_task_results_have_the_documented_shapes(tmp_path: Path) -> None:
    _, runtime = _setup(tmp_path)
    start = runtime.initial_params()
    trained = start + Train(1, 1, start, epochs=3).run(runtime).update
    select = Select(1, 2, torch.stack([start, trained])).run(runtime)
    assert select.choice == 1  # the trained model has the lower training loss
    assert select.tensors["scores"].shape == (2, 2)
    losses = Losses(1, 2, torch.stack([start, trained])).run(runtime).tensors["losses"]
    assert losses.shape == (2, runtime.num_examples(1))
    assert losses[1].mean() < losses[0].mean()
    basis = Basis(1, 2, rank=3).run(runtime)
    u, counts = basis.tensors["basis"], basis.tensors["counts"]
    assert u.shape == (10, 64, 3) and int(counts.sum()) == runtime.num_examples(1)
    present = int(counts.argmax())
    gram = u[present].T @ u[present]
    assert torch.allclose(gram, torch.eye(3, dtype=u.dtype), atol=1e-5)  # orthonormal
    probs = Responses(1, 2, start, torch.rand(5, 1, 8, 8)).run(runtime).tensors["responses"]
    assert probs.shape == (5, 10) and torch.allclose(probs.sum(1), torch.ones(5), atol=1e-5)


def test_proximal_term_pulls_training_towards_its_centre(tmp_path: Path) -> None:
    _, runtime = _setup(tmp_path)
    start = runtime.initial_params()
    free = Train(1, 2, start).run(runtime).update.norm()
    held = Train(1, 2, start, proximal_mu=5.0).run(runtime).update.norm()
    assert held < 0.8 * free


def test_zero_sample_weights_leave_the_model_unchanged(tmp_path: Path) -> None:
    _, runtime = _setup(tmp_path)
    start = runtime.initial_params()
    n = runtime.num_examples(1)
    update = Train(1, 2, start, sample_weights=torch.zeros(n)).run(runtime).update
    assert torch.count_nonzero(update) == 0
    ones = Train(1, 2, start, sample_weights=torch.ones(n)).run(runtime).update
    assert torch.allclose(ones, Train(1, 2, start).run(runtime).update, atol=1e-6)


def test_query_reports_partition_group_data_and_initial_models(tmp_path: Path) -> None:
    context, runtime = _setup(tmp_path)
    ask = RecordDict({"ask": ConfigRecord({"initial-models": 3})})
    info = app(Message(ask, 7, "query"), context).content
    assert info.config_records["info"]["client"] == 1
    assert info.config_records["info"]["group"] == int(runtime.data.groups[1])
    assert not info.config_records["info"]["masked"]
    models = record_tensors(info.array_records["models"])["models"]
    assert models.shape == (3, runtime.spec.size)
    assert torch.equal(models[0], runtime.initial_params())
    assert not torch.equal(models[1], models[2])  # distinct seeded initialisations


def test_an_evaluation_and_a_training_travel_as_one_message(tmp_path: Path) -> None:
    """One message per client and round: the model evaluated and the model trained are the same
    tensor, sent once; the two replies equal the tasks run on the runtime, in order."""
    context, runtime = _setup(tmp_path)
    start = runtime.initial_params()
    tasks: list[Task] = [Evaluate(1, 3, start), Train(1, 3, start.clone())]
    content = task_content(tasks)
    assert list(content.array_records["tensors"]) == ["t0"]  # equal tensors travel once
    message = Message(content, 7, message_type(tasks))
    assert message.metadata.message_type == "train.evaluate__train"
    replies = replies_from_message(app(message, context), 1, 2)
    for task, reply in zip(tasks, replies, strict=True):
        task.check(reply)
        local = task.run(runtime)
        assert reply.metrics == pytest.approx(local.metrics)
        assert all(torch.equal(reply.tensors[k], v) for k, v in local.tensors.items())
    assert "accuracy" in replies[0].metrics and "update" in replies[1].tensors
    with pytest.raises(InvalidReply, match="more replies"):
        replies_from_message(app(message, context), 1, 1)
    with pytest.raises(InvalidReply, match=r"'2\.reply'"):
        replies_from_message(app(message, context), 1, 3)
