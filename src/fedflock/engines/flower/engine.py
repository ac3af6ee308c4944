"""FlowerEngine: fedflock's round loop over a Flower `Grid` (deployment or simulation).

One Message per client and round, each carrying that client's own cluster model; replies are
matched back to clients through the partition id each node reported, never Flower's node id.
A reply that is an error or cannot be decoded is refused here, one its task does not accept
(wrong shape, NaN/Inf, missing metrics) by the shared engine logic; both are logged, never
averaged in. A node that does not answer in time is recorded as missing for that round.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedflock.client.task import InvalidReply, Reply, Task
from fedflock.config import ExperimentConfig
from fedflock.data.spec import DataSpec
from fedflock.engines.base import Engine
from fedflock.engines.flower.codec import (
    message_type,
    record_tensors,
    reply_from_message,
    task_content,
)
from fedflock.errors import FedflockError
from fedflock.models import ModelHandle, build_model

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
        self.model_cfg = config.model
        self.dtype = torch.float64 if config.training.dtype == "float64" else torch.float32
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
        asks = [Message(RecordDict({"ask": ConfigRecord({"initial-models": int(i == 0)})}),
                        node, "query") for i, node in enumerate(nodes)]
        replies = list(self.grid.send_and_receive(asks, timeout=self.connect_timeout))
        initial = None
        self._masked = False
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
            self._data_spec = DataSpec.from_dict(json.loads(str(info["data"])))
            self._masked = self._masked or bool(info["masked"])
            if len(reply.content.array_records["models"]):
                initial = record_tensors(reply.content.array_records["models"])["models"]
        if len(self.node_of) != self.expected or initial is None:
            raise FedflockError(f"flower: {len(self.node_of)} of {self.expected} nodes answered")
        self._initial = initial
        self._first_node = nodes[0]

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

    @property
    def data_spec(self) -> DataSpec:
        return self._data_spec

    def initial_models(self, count: int) -> torch.Tensor:
        """The first is the handshake's; more are asked of the first node (they must be made
        where the mask is known)."""
        if count <= 1:
            return self._initial.clone()
        ask = Message(RecordDict({"ask": ConfigRecord({"initial-models": count})}),
                      self._first_node, "query")
        reply = next(iter(self.grid.send_and_receive([ask], timeout=self.connect_timeout)), None)
        if reply is None or reply.has_error():
            reason = "no answer" if reply is None else reply.error.reason
            raise FedflockError(f"flower: node {self._first_node} failed to send {count} "
                                f"initial models: {reason}")
        return record_tensors(reply.content.array_records["models"])["models"]

    def model_handle(self) -> ModelHandle | None:
        if self._masked:
            return None
        spec = self._data_spec
        return ModelHandle(lambda: build_model(self.model_cfg, spec), self.dtype)

    def _send(self, messages: list[Message]) -> list[Message]:
        online = set(self.grid.get_node_ids())
        live = [m for m in messages if m.metadata.dst_node_id in online]
        return list(self.grid.send_and_receive(live, timeout=self.timeout)) if live else []

    def run_tasks(self, rnd: int, tasks: list[Task]) -> list[Reply]:
        messages = [Message(task_content(t), self.node_of[t.client], message_type(t))
                    for t in tasks]
        replies = []
        for message in self._send(messages):
            client = self.client_of.get(message.metadata.src_node_id)
            if client is None:  # the SuperLink answering for a node it lost: counted missing
                log.warning("round %d: %s", rnd, message.error.reason if message.has_error()
                            else "a reply from an unknown node")
                continue
            try:
                replies.append(reply_from_message(message, client))
            except InvalidReply as err:
                self.refuse(rnd, client, str(err))
        return sorted(replies, key=lambda r: r.client)
