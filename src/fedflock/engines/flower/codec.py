"""Any fedflock tasks and replies as a Flower message, generically.

A message carries one or more tasks for one client (e.g. an evaluation of the model it receives,
then its training: one message per client and round). Its type is `train.<kind>[__<kind>...]`.
Task i has its options in the ConfigRecord `i.options`, its address (client, round, kind) in
`i.task`, and in `i.tensors` the names of its tensors in the one ArrayRecord `tensors` the tasks
share: a tensor several tasks carry (the model evaluated and the model trained) travels once.
The reply to task i: tensors in the ArrayRecord `i.tensors`, metrics in the MetricRecord
`i.metrics`, client and example count in the ConfigRecord `i.reply`. The codec knows no task
kind; the task registry rebuilds each task.

A reply comes from a node the server does not trust, so it is decoded defensively: every array's
`.npy` header is read and checked against the bytes that actually arrived before anything is
allocated (a 150-byte reply claiming 30 GiB allocates nothing), only number types are decoded,
and every metadata value must be a number of the right kind. What a
reply *means* (shapes, finiteness, metrics) is checked by its task (`Task.check`) in the engine.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedflock.engines.flower.names import JOIN, PREFIX
from fedflock.wire import TASKS, InvalidReply, Reply, Task

NUMPY = "numpy.ndarray"


def message_type(tasks: Sequence[Task]) -> str:
    return PREFIX + JOIN.join(t.kind for t in tasks)


def kinds_of(message: Message) -> list[str]:
    kind = message.metadata.message_type
    if not kind.startswith(PREFIX):
        raise InvalidReply(f"message type {kind!r} is not a fedflock task")
    return kind.removeprefix(PREFIX).split(JOIN)


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


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b))


def task_content(tasks: Sequence[Task]) -> RecordDict:
    """Tasks for one client as one message's content (each distinct tensor once)."""
    shared: list[torch.Tensor] = []
    content = RecordDict()
    for i, task in enumerate(tasks):
        names = {}
        for name, tensor in task.tensors().items():
            index = next((j for j, t in enumerate(shared) if _same(t, tensor)), None)
            if index is None:
                shared.append(tensor)
                index = len(shared) - 1
            names[name] = f"t{index}"
        content[f"{i}.tensors"] = ConfigRecord(names)
        content[f"{i}.options"] = ConfigRecord(dict(task.options()))
        content[f"{i}.task"] = ConfigRecord({"client": task.client, "round": task.round,
                                             "kind": task.kind})
    content["tensors"] = tensors_record({f"t{j}": t for j, t in enumerate(shared)})
    return content


def tasks_from_message(message: Message, client: int) -> list[Task]:
    """The tasks a node received, refused unless they are addressed to this node's partition."""
    content = message.content
    shared = record_tensors(content.array_records["tensors"])
    tasks = []
    for i, kind in enumerate(kinds_of(message)):
        address = content.config_records[f"{i}.task"]
        if int(address["client"]) != client or address["kind"] != kind:
            raise ValueError(f"a {address['kind']} task for client {address['client']} reached "
                             f"partition {client} in a {kind} message")
        tensors = {name: shared[str(key)]
                   for name, key in content.config_records[f"{i}.tensors"].items()}
        tasks.append(TASKS.get(kind).from_parts(client, int(address["round"]), tensors,
                                                dict(content.config_records[f"{i}.options"])))
    return tasks


def reply_content(replies: Sequence[Reply]) -> RecordDict:
    content = RecordDict()
    for i, reply in enumerate(replies):
        content[f"{i}.tensors"] = tensors_record(reply.tensors)
        content[f"{i}.metrics"] = MetricRecord({k: float(v) for k, v in reply.metrics.items()})
        content[f"{i}.reply"] = ConfigRecord({"client": reply.client,
                                              "num-examples": reply.num_examples})
    return content


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


def replies_from_message(message: Message, client: int, count: int) -> list[Reply]:
    """The `count` replies of `client` as sent (one per task of the message it answers), or
    InvalidReply saying why they cannot be read."""
    if message.has_error():
        raise InvalidReply(f"client error: {message.error.reason}")
    extra = f"{count}.reply"
    if extra in message.content.config_records:
        raise InvalidReply(f"more replies than the {count} task(s) sent")
    return [_reply(message.content, client, f"{i}.") for i in range(count)]


def _reply(content: RecordDict, client: int, prefix: str) -> Reply:
    meta = _record(content.config_records, prefix + "reply")
    claimed = integer(meta, "client", "reply")
    if claimed != client:
        raise InvalidReply(f"reply claims client {claimed}")
    examples = integer(meta, "num-examples", "reply")
    metrics = {}
    for key, value in _record(content.metric_records, prefix + "metrics").items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidReply(f"metric {key!r} is not a number ({type(value).__name__})")
        metrics[key] = float(value)
    tensors = record_tensors(_record(content.array_records, prefix + "tensors"))
    return Reply(client, tensors, metrics, examples)
