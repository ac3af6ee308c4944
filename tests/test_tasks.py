"""The task vocabulary is open: a task kind defined here, outside the package, runs through the
executors, the Flower codec and the ClientApp with no change to any of them; replies that do not
fit their task are refused by the engine with a reason."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedflock.client.executors import EXECUTORS
from fedflock.client.runtime import ClientRuntime
from fedflock.client.tasks import Select, Train
from fedflock.engines.flower.clientapp import app
from fedflock.engines.flower.codec import (
    message_type,
    replies_from_message,
    reply_content,
    task_content,
    tasks_from_message,
)
from fedflock.wire import (
    TASKS,
    InvalidReply,
    Reply,
    Task,
    check_tensor,
    register_task,
)
from tests.conftest import small_config, small_runtime


@register_task
@dataclass
class ClassMeans(Task):
    """Mean input of each class present in `classes`, scaled by `scale` (a toy data signature)."""

    kind = "test_class_means"
    classes: torch.Tensor
    scale: float = 1.0

    def run(self, runtime: ClientRuntime) -> Reply:
        data = runtime.client_data(self.client)
        x = data.x_train.flatten(1)
        means = torch.stack([x[data.y_train == c].mean(0) if (data.y_train == c).any()
                             else torch.zeros(x.shape[1]) for c in self.classes.tolist()])
        return Reply(self.client, {"means": self.scale * means}, {"classes": len(self.classes)},
                     data.num_train)

    def check(self, reply: Reply) -> None:
        check_tensor(reply, "means", (len(self.classes), reply.tensors["means"].shape[1]))
        super().check(reply)


def test_a_task_defined_outside_the_package_runs_in_every_executor() -> None:
    runtime = small_runtime()
    tasks = [ClassMeans(c, 1, torch.tensor([0, 3]), scale=2.0) for c in range(runtime.num_clients)]
    expected = [t.run(runtime) for t in tasks]
    for name in ("sequential", "processes", "batched"):
        with EXECUTORS.get(name)(runtime, 2) as executor:
            assert not executor.accelerates(tasks[0])
            got = executor.run(tasks)
        for g, e, t in zip(got, expected, tasks, strict=True):
            t.check(g)
            assert g.client == t.client and torch.equal(g.tensors["means"], e.tensors["means"])


def test_a_new_task_round_trips_through_the_flower_codec_and_clientapp(tmp_path: Path) -> None:
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 7
    raw = small_config()
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 2}, state=RecordDict(),
                      run_config={"config": str(tmp_path / "c.yaml")})
    task = ClassMeans(2, 4, torch.tensor([1, 5, 9]), scale=0.5)
    message = Message(task_content([task]), 7, message_type([task]))
    assert message.metadata.message_type == "train.test_class_means"
    (decoded,) = tasks_from_message(message, 2)
    assert isinstance(decoded, ClassMeans) and decoded.scale == 0.5 and decoded.round == 4
    assert torch.equal(decoded.classes, task.classes)
    answer = app(message, context)  # the ClientApp's one generic handler
    (reply,) = replies_from_message(answer, 2, 1)
    task.check(reply)
    local = task.run(small_runtime())
    assert torch.equal(reply.tensors["means"], local.tensors["means"])
    assert reply.metrics == {"classes": 3.0} and reply.num_examples == local.num_examples
    # and the reply encoding is the inverse of the decoding
    (again,) = replies_from_message(Message(reply_content([reply]), reply_to=message), 2, 1)
    assert torch.equal(again.tensors["means"], reply.tensors["means"])


@pytest.mark.parametrize("corrupt, reason", [
    (lambda r: r.with_tensors(update=torch.full_like(r.update, float("nan"))), "NaN"),
    (lambda r: r.with_tensors(update=r.update[:-1]), "shape"),
    (lambda r: r.with_tensors(update=r.update.to(torch.int64)), "dtype"),
    (lambda r: Reply(r.client, r.tensors, {}, r.num_examples), "loss"),
    (lambda r: Reply(r.client + 1, r.tensors, r.metrics, r.num_examples), "claims"),
    (lambda r: Reply(r.client, r.tensors, {"loss": float("inf")}, r.num_examples), "finite"),
])
def test_train_check_refuses_malformed_replies(corrupt, reason: str) -> None:
    runtime = small_runtime()
    task = Train(0, 1, runtime.initial_params())
    good = task.run(runtime)
    task.check(good)
    with pytest.raises(InvalidReply, match=reason):
        task.check(corrupt(good))


def test_select_check_refuses_a_choice_outside_the_models() -> None:
    runtime = small_runtime()
    start = runtime.initial_params()
    task = Select(0, 1, torch.stack([start, start * 0.5]))
    good = task.run(runtime)
    task.check(good)
    bad = Reply(0, good.tensors, {**good.metrics, "choice": 2.0}, good.num_examples)
    with pytest.raises(InvalidReply, match="choice"):
        task.check(bad)


@pytest.mark.parametrize("kind", ["has space", "a__b", "1st"])
def test_a_task_kind_must_fit_a_flower_message_type(kind: str) -> None:
    """`train.<kind>` must be a valid Flower type, and `__` joins the kinds of one message."""
    bad = type("Bad", (ClassMeans,), {"kind": kind})
    with pytest.raises(ValueError, match="identifier"):
        register_task(bad)
    assert kind not in TASKS
