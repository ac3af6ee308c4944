"""Any fedflock task and reply as a Flower message, generically.

A task travels as message type `train.<kind>` with its tensors in the ArrayRecord `tensors`, its
options in the ConfigRecord `options` and its address (client, round) in the ConfigRecord `task`.
A reply: tensors in `tensors`, metrics in the MetricRecord `metrics`, client and example count in
the ConfigRecord `reply`. The codec knows no task kind; the task registry rebuilds the task.

A reply comes from a node the server does not trust, so it is decoded defensively: every array's
`.npy` header is read and checked against the bytes that actually arrived before anything is
allocated (a 150-byte reply claiming 30 GiB allocates nothing), only number types are decoded,
and every metadata value must be a number of the right kind. What a
reply *means* (shapes, finiteness, metrics) is checked by its task (`Task.check`) in the engine.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedflock.client.task import TASKS, InvalidReply, Reply, Task

PREFIX = "train."
NUMPY = "numpy.ndarray"


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


def decode_array(name: str, array: Array) -> torch.Tensor:
    """The tensor in `array`, read from its `.npy` header after checking that header against the
    bytes that arrived: nothing larger than the message is ever allocated. Raises InvalidReply.
    (Whether the type is the agreed one is the engine's check, for every engine alike.)"""
    if array.stype != NUMPY or not isinstance(array.data, bytes):
        raise InvalidReply(f"{name!r}: serialisation {array.stype!r}, expected {NUMPY!r}")
    buffer = io.BytesIO(array.data)
    try:
        major, _ = np.lib.format.read_magic(buffer)
        read_header = (np.lib.format.read_array_header_1_0 if major == 1
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, found = read_header(buffer)
    except (ValueError, TypeError, OSError, SyntaxError) as err:
        raise InvalidReply(f"{name!r}: not an .npy array ({err})") from None
    if found.hasobject or found.kind not in "fiu":
        raise InvalidReply(f"{name!r}: dtype {found}, not a number type")
    count = math.prod(shape)
    size = count * found.itemsize
    arrived = len(array.data) - buffer.tell()
    if arrived != size:
        raise InvalidReply(f"{name!r}: header claims shape {tuple(shape)} ({size:,} bytes), "
                           f"{arrived:,} bytes arrived")
    if tuple(array.shape) != tuple(shape) or str(array.dtype) != str(found):
        raise InvalidReply(f"{name!r}: metadata {array.dtype}{list(array.shape)} disagree with "
                           f"the data {found}{list(shape)}")
    values = np.frombuffer(array.data, dtype=found, count=count, offset=buffer.tell())
    values = values.reshape(shape, order="F" if fortran else "C")
    return torch.from_numpy(np.array(values))  # a writable copy of exactly what arrived


def record_tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: decode_array(k, a) for k, a in record.items()}


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


def integer(record: Mapping[str, object], key: str, where: str) -> int:
    """`record[key]` as an int, refused unless it is a whole number (not a bool, not 1e300)."""
    if key not in record:
        raise InvalidReply(f"{where} without {key!r}")
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            isinstance(value, int) or (math.isfinite(value) and value.is_integer())):
        raise InvalidReply(f"{where}: {key!r} is not a whole number ({value!r})")
    return int(value)


def _record(records: Mapping[str, Any], name: str) -> Any:
    if name not in records:
        raise InvalidReply(f"reply without its record {name!r}")
    return records[name]


def reply_from_message(message: Message, client: int) -> Reply:
    """The reply of `client` as sent, or InvalidReply saying why it cannot be read."""
    if message.has_error():
        raise InvalidReply(f"client error: {message.error.reason}")
    content = message.content
    meta = _record(content.config_records, "reply")
    claimed = integer(meta, "client", "reply")
    if claimed != client:
        raise InvalidReply(f"reply claims client {claimed}")
    examples = integer(meta, "num-examples", "reply")
    metrics = {}
    for key, value in _record(content.metric_records, "metrics").items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidReply(f"metric {key!r} is not a number ({type(value).__name__})")
        metrics[key] = float(value)
    tensors = record_tensors(_record(content.array_records, "tensors"))
    return Reply(client, tensors, metrics, examples)
