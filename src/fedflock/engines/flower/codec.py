"""fedflock tasks and replies as Flower message contents, with validation of what comes back."""

from __future__ import annotations

import math

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedflock.client.protocol import TrainReply, TrainTask

PARAMS = "params"
UPDATE = "update"
SCORES = "scores"


def vector_record(key: str, vector: torch.Tensor) -> ArrayRecord:
    return ArrayRecord({key: Array(vector.detach().cpu().numpy())})


def record_vector(content: RecordDict, key: str) -> torch.Tensor:
    array = content.array_records[key][key].numpy()
    return torch.from_numpy(np.ascontiguousarray(array))


def task_content(task: TrainTask) -> RecordDict:
    config = {"client": task.client, "round": task.round, "mode": task.mode,
              "epochs": task.epochs or 0}
    return RecordDict({PARAMS: vector_record(PARAMS, task.params),
                       "config": ConfigRecord(config)})


def task_from_content(content: RecordDict, client: int) -> TrainTask:
    config = content.config_records["config"]
    if int(config["client"]) != client:
        raise ValueError(f"task for client {config['client']} reached partition {client}")
    epochs = int(config["epochs"]) or None
    return TrainTask(client, record_vector(content, PARAMS), int(config["round"]),
                     str(config["mode"]), epochs)  # type: ignore[arg-type]


def reply_content(reply: TrainReply) -> RecordDict:
    metrics = {"client": reply.client, "num-examples": reply.num_examples, "loss": reply.loss}
    if reply.choice is not None:
        metrics["choice"] = reply.choice
    content = RecordDict({UPDATE: vector_record(UPDATE, reply.update),
                          "metrics": MetricRecord(metrics)})
    if reply.payload is not None:
        content[SCORES] = vector_record(SCORES, reply.payload)
    return content


def reply_from_message(message: Message, expected_size: int, client: int) -> TrainReply:
    """The reply of `client`, or ValueError saying why it is refused (never averaged in)."""
    if message.has_error():
        raise ValueError(f"client error: {message.error.reason}")
    content = message.content
    try:
        update = record_vector(content, UPDATE)
        metrics = content.metric_records["metrics"]
    except KeyError as err:
        raise ValueError(f"reply without {err}") from None
    if update.dim() != 1 or update.numel() != expected_size:
        raise ValueError(f"update of shape {tuple(update.shape)}, expected ({expected_size},)")
    if not torch.isfinite(update).all():
        raise ValueError("update contains NaN or Inf")
    if int(metrics["client"]) != client:
        raise ValueError(f"reply claims client {metrics['client']}")
    loss = float(metrics["loss"])
    payload = record_vector(content, SCORES) if SCORES in content.array_records else None
    choice = int(metrics["choice"]) if "choice" in metrics else None
    return TrainReply(client, update, int(metrics["num-examples"]),
                      loss if math.isfinite(loss) else float("nan"), payload=payload,
                      choice=choice)
