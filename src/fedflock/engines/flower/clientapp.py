"""The fedflock ClientApp: Flower messages in, fedflock client tasks, Flower messages out.

Each node is one fedflock client, `partition-id` in its node config. Its data come from the
experiment's scenario (built deterministically from the config and seed, so every node derives
the same split and keeps its own partition). `mask-seed` in the node config turns on permutation
masking with a seed that only the clients know (the ServerApp never reads node configs).
`fault` in the node config (`nan`, `shape`) makes the node send a corrupted update, to test
that the server refuses it.
"""

from __future__ import annotations

import json

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedflock.client.runtime import ClientRuntime
from fedflock.config import dump_config
from fedflock.data.scenarios import build_federated_data
from fedflock.engines.flower.codec import (
    PREFIX,
    reply_content,
    task_from_message,
    tensors_record,
)
from fedflock.engines.flower.settings import experiment_config

_runtimes: dict[str, ClientRuntime] = {}


def _runtime(context: Context) -> tuple[ClientRuntime, int]:
    config = experiment_config(context.run_config)
    if "mask-seed" in context.node_config:  # the clients' shared secret, never the server's
        privacy = config.privacy.model_copy(update={
            "masking": True, "mask_seed": int(context.node_config["mask-seed"])})
        config = config.model_copy(update={"privacy": privacy})
    key = dump_config(config)
    if key not in _runtimes:
        data = build_federated_data(config.data, config.seed)
        _runtimes[key] = ClientRuntime(data, config.model, config.training, config.seed,
                                       config.privacy, config.attack)
    return _runtimes[key], int(context.node_config["partition-id"])


def handle_task(message: Message, context: Context) -> Message:
    """The one handler of every task kind (`train.<kind>`): decode, run, encode."""
    runtime, client = _runtime(context)
    reply = runtime.run([task_from_message(message, client)])[0]
    fault = str(context.node_config.get("fault", ""))
    if fault and "update" in reply.tensors:
        update = reply.update
        reply = reply.with_tensors(update=torch.full_like(update, float("nan"))
                                   if fault == "nan" else update[:-1])
    return Message(reply_content(reply), reply_to=message)


class TaskClientApp(ClientApp):
    """A ClientApp that routes every `train.<kind>` message to `handle_task`, so a task kind
    registered later (a plugin's) needs no handler of its own."""

    def __call__(self, message: Message, context: Context) -> Message:
        if message.metadata.message_type.startswith(PREFIX):
            return handle_task(message, context)
        return super().__call__(message, context)


app = TaskClientApp()


@app.query()
def query(message: Message, context: Context) -> Message:
    """Who am I: partition id, example count, hidden group (evaluation only), model layout, data
    description, whether this node masks, and the agreed initial model(s) (masked when masking
    is on) when the server asks for them (`initial-models`: how many)."""
    runtime, client = _runtime(context)
    info = {"client": client, "num-examples": runtime.num_examples(client),
            "group": int(runtime.data.groups[client]),
            "update-size": runtime.spec.num_trainable,
            "data": json.dumps(runtime.data_spec.to_dict()),
            "masked": runtime.mask is not None}
    content = RecordDict({"info": ConfigRecord(info)})
    count = int(message.content.config_records["ask"]["initial-models"])
    content["models"] = (tensors_record({"models": runtime.initial_models(count)}) if count
                         else ArrayRecord())
    return Message(content, reply_to=message)
