"""FlowerEngine: fedflock's round loop over a Flower `Grid` (deployment or simulation).

One Message per client and round, each carrying that client's own cluster model; replies are
matched back to clients through the partition id each node reported, never Flower's node id.
A reply that is an error, has the wrong shape or holds NaN/Inf is refused and logged (never
averaged in); a node that does not answer in time is recorded as missing for that round.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedflock.client.protocol import TrainReply, TrainTask
from fedflock.config import ExperimentConfig
from fedflock.engines.base import Engine
from fedflock.engines.flower.codec import (
    PARAMS,
    record_vector,
    reply_from_message,
    task_content,
    vector_record,
)
from fedflock.errors import FedflockError

log = logging.getLogger("fedflock.flower")


class FlowerEngine(Engine):
    name = "flower"

    def __init__(self, grid: Grid, config: ExperimentConfig, timeout: float = 120.0,
                 connect_timeout: float = 300.0) -> None:
        super().__init__()
        self.grid = grid
        self.timeout = timeout
        self.connect_timeout = max(connect_timeout, timeout)
        self.expected = config.data.clients
        self.node_of: dict[int, int] = {}
        self.client_of: dict[int, int] = {}
        self._groups = np.zeros(self.expected, dtype=np.int64)
        self._connect()

    # -- handshake -----------------------------------------------------------------------
    def _connect(self) -> None:
        deadline = time.monotonic() + self.connect_timeout
        nodes: list[int] = []
        while time.monotonic() < deadline:
            nodes = sorted(self.grid.get_node_ids())
            if len(nodes) >= self.expected:
                break
            time.sleep(0.5)
        if len(nodes) < self.expected:
            raise FedflockError(f"flower: {len(nodes)} nodes connected, the config has "
                                f"{self.expected} clients")
        asks = [Message(RecordDict({"ask": ConfigRecord({"initial-params": int(i == 0)})}),
                        node, "query") for i, node in enumerate(nodes)]
        replies = list(self.grid.send_and_receive(asks, timeout=self.connect_timeout))
        initial = None
        for reply in replies:
            if reply.has_error():
                raise FedflockError(f"flower: node {reply.metadata.src_node_id} failed: "
                                    f"{reply.error.reason}")
            info = reply.content.config_records["info"]
            client = int(info["client"])
            if client in self.node_of or not 0 <= client < self.expected:
                raise FedflockError(f"flower: partition-id {client} is duplicated or outside "
                                    f"0..{self.expected - 1}")
            self.node_of[client] = reply.metadata.src_node_id
            self.client_of[reply.metadata.src_node_id] = client
            self._groups[client] = int(info["group"])
            self._update_size = int(info["update-size"])
            if len(reply.content.array_records[PARAMS]):
                initial = record_vector(reply.content, PARAMS)
        if len(self.node_of) != self.expected or initial is None:
            raise FedflockError(f"flower: {len(self.node_of)} of {self.expected} nodes answered")
        self._initial = initial

    # -- Engine --------------------------------------------------------------------------
    @property
    def num_clients(self) -> int:
        return self.expected

    @property
    def update_size(self) -> int:
        return self._update_size

    @property
    def true_groups(self) -> np.ndarray:
        return self._groups

    @property
    def executor_name(self) -> str:
        return "flower"

    def initial_params(self) -> torch.Tensor:
        return self._initial.clone()

    def _send(self, messages: list[Message]) -> list[Message]:
        online = set(self.grid.get_node_ids())
        live = [m for m in messages if m.metadata.dst_node_id in online]
        return list(self.grid.send_and_receive(live, timeout=self.timeout)) if live else []

    def run_tasks(self, rnd: int, tasks: list[TrainTask]) -> list[TrainReply]:
        sizes = {t.client: t.model_size for t in tasks}
        messages = [Message(task_content(t), self.node_of[t.client], "train") for t in tasks]
        replies = []
        for message in self._send(messages):
            client = self.client_of.get(message.metadata.src_node_id)
            if client is None:  # the SuperLink answering for a node it lost: counted missing
                log.warning("round %d: %s", rnd, message.error.reason if message.has_error()
                            else "a reply from an unknown node")
                continue
            try:
                replies.append(reply_from_message(message, sizes.get(client, 0), client))
            except ValueError as err:
                self.rejected.append({"round": rnd, "client": client, "reason": str(err)})
                log.warning("round %d: refused the reply of client %d: %s", rnd, client, err)
        return sorted(replies, key=lambda r: r.client)

    def evaluate_models(self, models: dict[int, torch.Tensor]) -> dict[int, tuple[float, float]]:
        messages = [Message(RecordDict({PARAMS: vector_record(PARAMS, params)}),
                            self.node_of[c], "evaluate") for c, params in models.items()]
        out = {}
        for reply in self._send(messages):
            if reply.has_error():
                continue
            metrics = reply.content.metric_records["metrics"]
            out[int(metrics["client"])] = (float(metrics["accuracy"]), float(metrics["loss"]))
        return dict(sorted(out.items()))
