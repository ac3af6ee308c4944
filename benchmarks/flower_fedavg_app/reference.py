"""Flower's FedAvg strategy, unchanged, with fedflock's model, data and local SGD on the clients.

The ServerApp writes `timing.json` (seconds for all rounds, rounds) into the run config's `out`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedflock.client.tasks import Evaluate, Train
from fedflock.data.spec import DataSpec
from fedflock.engines.flower.handler import _runtime
from fedflock.engines.flower.settings import experiment_config
from fedflock.models import build_model

client = ClientApp()
server = ServerApp()


@client.train()
def train(message: Message, context: Context) -> Message:
    runtime, pid = _runtime(context)
    runtime.model.load_state_dict(message.content["arrays"].to_torch_state_dict())
    start = runtime.spec.flatten(runtime.model)
    rnd = int(message.content["config"]["server-round"])
    reply = Train(pid, rnd, start).run(runtime)
    runtime.spec.load(runtime.model, start + reply.update)
    metrics = MetricRecord({"num-examples": reply.num_examples, "train-loss": reply.loss})
    return Message(RecordDict({"arrays": ArrayRecord(runtime.model.state_dict()),
                               "metrics": metrics}), reply_to=message)


@client.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    runtime, pid = _runtime(context)
    runtime.model.load_state_dict(message.content["arrays"].to_torch_state_dict())
    scores = Evaluate(pid, 0, runtime.spec.flatten(runtime.model)).run(runtime).metrics
    accuracy, loss = scores["accuracy"], scores["loss"]
    metrics = MetricRecord({"num-examples": len(runtime.data.clients[pid].y_test),
                            "accuracy": accuracy, "loss": loss})
    return Message(RecordDict({"metrics": metrics}), reply_to=message)


@client.query()
def warm_up(message: Message, context: Context) -> Message:
    """Load data and model once, as fedflock's handshake does, so that rounds compare fairly."""
    _runtime(context)
    return Message(RecordDict(), reply_to=message)


@server.main()
def main(grid: Grid, context: Context) -> None:
    config = experiment_config(context.run_config)
    out = Path(str(context.run_config["out"]))
    out.mkdir(parents=True, exist_ok=True)
    clients = config.data.clients
    while len(list(grid.get_node_ids())) < clients:
        time.sleep(0.5)
    grid.send_and_receive([Message(RecordDict(), node, "query") for node in grid.get_node_ids()])
    # The input shape/classes of fedflock's scenario, without building any client data.
    from fedflock.data import load_dataset

    dataset = load_dataset(config.data.dataset, config.data.resolved_root())
    model = build_model(config.model, DataSpec(dataset.input_shape, dataset.num_classes))
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_available_nodes=clients,
                      min_train_nodes=clients, min_evaluate_nodes=clients)
    start = time.perf_counter()
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                   num_rounds=config.rounds)
    seconds = time.perf_counter() - start
    (out / "timing.json").write_text(json.dumps({"seconds": seconds, "rounds": config.rounds}))
