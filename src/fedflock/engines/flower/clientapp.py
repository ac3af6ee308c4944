"""The fedflock ClientApp: Flower messages in, fedflock client tasks, Flower messages out.

Each node is one fedflock client, `partition-id` in its node config. Its data come from the
experiment's scenario (built deterministically from the config and seed, so every node derives
the same split and keeps its own partition). `mask-seed` in the node config turns on permutation
masking with a seed that only the clients know (the ServerApp never reads node configs).
`fault` in the node config (`nan`, `shape`) makes the node send a corrupted update, to test
that the server refuses it.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedflock.client.runtime import ClientRuntime
from fedflock.config import dump_config
from fedflock.data.scenarios import build_federated_data
from fedflock.engines.flower.codec import (
    PARAMS,
    record_vector,
    reply_content,
    task_from_content,
    vector_record,
)
from fedflock.engines.flower.settings import experiment_config

app = ClientApp()
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


@app.train()
def train(message: Message, context: Context) -> Message:
    runtime, client = _runtime(context)
    reply = runtime.train(task_from_content(message.content, client))
    fault = str(context.node_config.get("fault", ""))
    if fault == "nan":
        reply.update = torch.full_like(reply.update, float("nan"))
    elif fault == "shape":
        reply.update = reply.update[:-1]
    return Message(reply_content(reply), reply_to=message)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    runtime, client = _runtime(context)
    accuracy, loss = runtime.evaluate({client: record_vector(message.content, PARAMS)})[client]
    metrics = MetricRecord({"client": client, "accuracy": accuracy, "loss": loss})
    return Message(RecordDict({"metrics": metrics}), reply_to=message)


@app.query()
def query(message: Message, context: Context) -> Message:
    """Who am I: partition id, example count, hidden group (evaluation only), model layout, and
    the agreed initial model (masked when masking is on) when the server asks for it."""
    runtime, client = _runtime(context)
    info = {"client": client, "num-examples": runtime.num_examples(client),
            "group": int(runtime.data.groups[client]),
            "update-size": runtime.spec.num_trainable}
    content = RecordDict({"info": ConfigRecord(info)})
    if int(message.content.config_records["ask"]["initial-params"]):
        content[PARAMS] = vector_record(PARAMS, runtime.initial_params())
    else:
        content[PARAMS] = ArrayRecord()
    return Message(content, reply_to=message)


# Custom actions (`train.<action>`) for tasks other algorithms ask of clients. Each takes the
# inputs in the message's `inputs` ArrayRecord and answers with `outputs`.
def _answer(message: Message, key: str, value: torch.Tensor) -> Message:
    return Message(RecordDict({"outputs": vector_record(key, value)}), reply_to=message)


def _input(message: Message, key: str) -> torch.Tensor:
    return torch.from_numpy(message.content.array_records["inputs"][key].numpy().copy())


@app.train("losses")
def losses(message: Message, context: Context) -> Message:
    """Loss of each of K models (`inputs.models`, shape (K, P)) on this client's data."""
    runtime, client = _runtime(context)
    return _answer(message, "losses", runtime.losses(client, _input(message, "models")))


@app.train("basis")
def basis(message: Message, context: Context) -> Message:
    """Top-`rank` singular vectors of this client's data (`config.rank`)."""
    runtime, client = _runtime(context)
    rank = int(message.content.config_records["config"]["rank"])
    return _answer(message, "basis", runtime.basis(client, rank))


@app.train("responses")
def responses(message: Message, context: Context) -> Message:
    """Softmax responses of the sent model (`inputs.params`) to the sent `inputs.inputs`."""
    runtime, _ = _runtime(context)
    out = runtime.responses(_input(message, "params"), _input(message, "inputs"))
    return _answer(message, "responses", out)
