"""What a fedflock node does with a message: decode its tasks, run them on the node's client
runtime, encode the replies (or answer the handshake). Imported by the ClientApp in its own
process, or by the node's long-lived worker (`fedflock.engines.flower.worker`), which keeps the
runtime warm so that a message need not import torch at all.

Each node is one fedflock client, `partition-id` in its node config. Its data are its own files
(`data-path`: an `.npz`, see `load_node_files`; the hidden group is then unknown and no ARI is
reported) or, without `data-path`, its partition of the experiment's scenario, drawn once and
kept in a node-local cache (`cache-dir`, default `$FEDFLOCK_CACHE/partitions`): a message loads
one small file, never everyone's data. `mask-seed` in the node config turns on permutation
masking with a seed that only the clients know (the ServerApp never reads node configs).
`fault` in the node config (`nan`, `shape`) makes the node send a corrupted update, to test
that the server refuses it.

It imports no server-side library (the algorithms import SciPy, scikit-learn and NetworkX only
where they are used).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fedflock.client.runtime import ClientRuntime
from fedflock.config import ExperimentConfig, dump_config
from fedflock.data.partition import NodeData, load_node_files, scenario_partition
from fedflock.engines.flower.codec import (
    record_tensors,
    reply_content,
    tasks_from_message,
    tensors_record,
)
from fedflock.engines.flower.settings import experiment_config
from fedflock.wire import Reply

STATE = "fedflock.client-state"  # the ArrayRecord of the node's Context.state holding it
# One process may serve several partitions (Flower's simulation runtime reuses its workers).
# Kept for a few partitions only: a simulation worker serving thousands must not hold them all.
MAX_RUNTIMES = 8
_runtimes: OrderedDict[tuple[str, int, str], ClientRuntime] = OrderedDict()


def _node_data(context: Context, config: ExperimentConfig, partition: int) -> NodeData:
    node = context.node_config
    if "data-path" in node:
        return load_node_files(Path(str(node["data-path"])), partition, config.data.clients)
    cache = Path(str(node["cache-dir"])) if "cache-dir" in node else None
    return scenario_partition(config.data, config.seed, partition, cache)


def _runtime(context: Context) -> tuple[ClientRuntime, int]:
    config = experiment_config(context.run_config)
    if "mask-seed" in context.node_config:  # the clients' shared secret, never the server's
        privacy = config.privacy.model_copy(update={
            "masking": True, "mask_seed": int(context.node_config["mask-seed"])})
        config = config.model_copy(update={"privacy": privacy})
    partition = int(context.node_config["partition-id"])
    key = (dump_config(config), partition, str(context.node_config.get("data-path", "")))
    if key in _runtimes:
        _runtimes.move_to_end(key)
    else:
        while len(_runtimes) >= MAX_RUNTIMES:
            _runtimes.popitem(last=False)
        _runtimes[key] = ClientRuntime(_node_data(context, config, partition), config.model,
                                       config.training, config.seed, config.privacy,
                                       config.attack)
    return _runtimes[key], partition


def answer(message: Message, context: Context) -> RecordDict:
    """The content of the reply to a fedflock message: tasks (`train.<kind>[__<kind>...]`)
    or the handshake (`query`). Updates `context.state` with what the client keeps."""
    if message.metadata.message_type == "query":
        return _query(message, context)
    runtime, client = _runtime(context)
    tasks = tasks_from_message(message, client)
    kept = context.state.array_records.get(STATE)  # what this client kept between rounds
    runtime.states[client] = record_tensors(kept) if kept is not None else {}
    replies = runtime.run(tasks)
    state = runtime.states.pop(client, {})
    if state:
        context.state[STATE] = tensors_record(state)
    elif STATE in context.state:  # a task emptied it: so it is, as on the embedded engine
        del context.state[STATE]
    fault = str(context.node_config.get("fault", ""))
    if fault:
        replies = [_corrupt(reply, fault) for reply in replies]
    return reply_content(replies)


def _corrupt(reply: Reply, fault: str) -> Reply:
    if "update" not in reply.tensors:
        return reply
    update = reply.update
    return reply.with_tensors(update=torch.full_like(update, float("nan"))
                              if fault == "nan" else update[:-1])


def _query(message: Message, context: Context) -> RecordDict:
    """Who am I: partition id, example count, hidden group (evaluation only), model layout, data
    description, whether this node masks, the digest of its tokenizer (text), and the agreed
    initial model(s) (masked when masking is on) with the tokenizer itself when the server asks
    for them (`initial-models`: how many)."""
    runtime, client = _runtime(context)
    tokenizer = runtime.data.tokenizer
    info = {"client": client, "num-examples": runtime.num_examples(client),
            "update-size": runtime.spec.num_trainable,
            "data": json.dumps(runtime.data_spec.to_dict()),
            "masked": runtime.mask is not None,
            "tokenizer": hashlib.sha256(tokenizer.encode()).hexdigest() if tokenizer else ""}
    group = runtime.data.group_of(client)
    if group is not None:  # unknown on a device serving its own files
        info["group"] = group
    content = RecordDict({"info": ConfigRecord(info)})
    count = int(message.content.config_records["ask"]["initial-models"])
    content["models"] = (tensors_record({"models": runtime.initial_models(count)}) if count
                         else ArrayRecord())
    if count and tokenizer:
        content["tokenizer"] = ConfigRecord({"json": tokenizer})
    return content
