"""Any fedflock task and reply as a Flower message, generically.

A task travels as message type `train.<kind>` with its tensors in the ArrayRecord `tensors`, its
options in the ConfigRecord `options` and its address (client, round) in the ConfigRecord `task`.
A reply: tensors in `tensors`, metrics in the MetricRecord `metrics`, client and example count in
the ConfigRecord `reply`. The codec knows no task kind; the task registry rebuilds the task.
What a reply *means* is checked by its task (`Task.check`) in the engine, not here.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedflock.client.task import TASKS, InvalidReply, Reply, Task

PREFIX = "train."


def message_type(task: Task) -> str:
    return PREFIX + task.kind


def kind_of(message: Message) -> str:
    kind = message.metadata.message_type
    if not kind.startswith(PREFIX):
        raise InvalidReply(f"message type {kind!r} is not a fedflock task")
    return kind.removeprefix(PREFIX)


def tensors_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    return ArrayRecord({k: Array(v.detach().cpu().contiguous().numpy())
                        for k, v in tensors.items()})


def record_tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(a.numpy())) for k, a in record.items()}


def task_content(task: Task) -> RecordDict:
    return RecordDict({"tensors": tensors_record(task.tensors()),
                       "options": ConfigRecord(dict(task.options())),
                       "task": ConfigRecord({"client": task.client, "round": task.round})})


def task_from_message(message: Message, client: int) -> Task:
    """The task a node received, refused unless it is addressed to this node's partition."""
    content = message.content
    address = content.config_records["task"]
    if int(address["client"]) != client:
        raise ValueError(f"task for client {address['client']} reached partition {client}")
    return TASKS.get(kind_of(message)).from_parts(
        client, int(address["round"]), record_tensors(content.array_records["tensors"]),
        dict(content.config_records["options"]))


def reply_content(reply: Reply) -> RecordDict:
    return RecordDict({"tensors": tensors_record(reply.tensors),
                       "metrics": MetricRecord({k: float(v) for k, v in reply.metrics.items()}),
                       "reply": ConfigRecord({"client": reply.client,
                                              "num-examples": reply.num_examples})})


def reply_from_message(message: Message, client: int) -> Reply:
    """The reply of `client` as sent, or InvalidReply saying why it cannot be read."""
    if message.has_error():
        raise InvalidReply(f"client error: {message.error.reason}")
    content = message.content
    try:
        meta = content.config_records["reply"]
        tensors = record_tensors(content.array_records["tensors"])
        metrics = {k: float(v) for k, v in content.metric_records["metrics"].items()}
        claimed, examples = int(meta["client"]), int(meta["num-examples"])
    except (KeyError, TypeError, ValueError) as err:
        raise InvalidReply(f"malformed reply ({type(err).__name__}: {err})") from None
    if claimed != client:
        raise InvalidReply(f"reply claims client {claimed}")
    return Reply(client, tensors, metrics, examples)
