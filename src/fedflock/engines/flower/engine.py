"""FlowerEngine: fedflock's round loop over a Flower `Grid` (deployment or simulation).

One Message per client and round, each carrying that client's own cluster model; replies are
matched back to clients through the partition id each node reported, never Flower's node id.
A reply that is an error or cannot be decoded is refused here, one its task does not accept
(wrong shape, NaN/Inf, missing metrics) by the shared engine logic; both are logged, never
averaged in. A node that does not answer in time is recorded as missing for that round.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedflock.config import ExperimentConfig
from fedflock.data.spec import DataSpec
from fedflock.engines.base import Engine
from fedflock.engines.flower.codec import (
    integer,
    message_type,
    record_tensors,
    replies_from_message,
    task_content,
)
from fedflock.errors import FedflockError
from fedflock.models import ModelHandle, build_model
from fedflock.wire import InvalidReply, Reply, Task

log = logging.getLogger("fedflock.flower")


class FlowerEngine(Engine):
    name = "flower"
    pays_per_message = True

    def __init__(self, grid: Grid, config: ExperimentConfig, timeout: float = 120.0,
                 connect_timeout: float = 300.0) -> None:
        super().__init__()
        self.grid = grid
        self.timeout = timeout
        self.connect_timeout = max(connect_timeout, timeout)
        self.expected = config.data.clients
        self.model_cfg = config.model
        self.dtype = torch.float64 if config.training.dtype == "float64" else torch.float32
        self.node_of: dict[int, int] = {}  # partition -> Flower node
        self.client_of: dict[int, int] = {}  # Flower node -> partition
        self._groups = np.zeros(self.expected, dtype=np.int64)
        self._reference: int | None = None  # partition whose node set the agreed values
        self._agreed: dict[str, Any] = {}
        self._first_node = 0
        self._initial: torch.Tensor | None = None
        self._update_size = 0
        self._masked = False
        self._data_spec: DataSpec | None = None
        self._tokenizer: str | None = None
        self._connect()

    # -- handshake -----------------------------------------------------------------------
    def _connect(self) -> None:
        """Wait for as many nodes as clients, query them all, then give the partitions still
        without a node one round timeout more to join. A node that fails, lies or duplicates a
        partition is refused and logged; the others go on."""
        deadline = time.monotonic() + self.connect_timeout
        nodes = sorted(self.grid.get_node_ids())
        while len(nodes) < self.expected and time.monotonic() < deadline:
            time.sleep(0.5)
            nodes = sorted(self.grid.get_node_ids())
        queried: set[int] = set()
        stragglers = None  # when the wait for partitions without a node ends
        while True:
            new = [n for n in nodes if n not in queried]
            if new:
                queried.update(new)
                self._handshake(new)
            if len(self.node_of) == self.expected:
                break
            now = time.monotonic()
            stragglers = stragglers or min(deadline, now + self.timeout)
            if now >= stragglers:
                break
            time.sleep(0.5)
            nodes = sorted(self.grid.get_node_ids())
        if self._reference is None or self._initial is None:
            raise FedflockError(f"flower: no node gave a usable handshake within "
                                f"{self.connect_timeout:.0f} s ({len(queried)} connected)")
        absent = sorted(set(range(self.expected)) - set(self.node_of))
        if absent:
            log.warning("flower: no node for partition(s) %s; the run goes on without them",
                        absent)

    def _handshake(self, nodes: list[int]) -> None:
        ask_models = self._reference is None  # the first node asked sends the initial model
        asks = [Message(RecordDict({"ask": ConfigRecord({"initial-models": int(
            ask_models and i == 0)})}), node, "query") for i, node in enumerate(nodes)]
        replies = list(self.grid.send_and_receive(asks, timeout=self.connect_timeout))
        for reply in sorted(replies, key=lambda r: r.metadata.src_node_id):
            node = reply.metadata.src_node_id
            try:
                if node not in nodes:
                    raise InvalidReply("a node that was not asked")
                self._admit(node, self._read_info(reply),
                            reply if ask_models and node == nodes[0] else None)
            except InvalidReply as err:
                self.refuse(0, None, f"handshake: {err}", node=node)
        if self._reference is not None and self._initial is None:
            self._initial = self.initial_models(1)[0]

    def _read_info(self, reply: Message) -> dict[str, Any]:
        """What a node says of itself, checked for type and range. Raises InvalidReply."""
        if reply.has_error():
            raise InvalidReply(f"node error: {reply.error.reason}")
        if "info" not in reply.content.config_records:
            raise InvalidReply("no 'info' record")
        info = reply.content.config_records["info"]
        client = integer(info, "client", "handshake")
        if not 0 <= client < self.expected:
            raise InvalidReply(f"partition-id {client} outside 0..{self.expected - 1}")
        examples = integer(info, "num-examples", "handshake")
        if examples < 1:
            raise InvalidReply(f"num-examples {examples} is not a positive count")
        return {"client": client, "examples": examples,
                "group": integer(info, "group", "handshake") if "group" in info else -1,
                "agreed": {"update-size": integer(info, "update-size", "handshake"),
                           "data": str(info.get("data", "")),
                           "masked": bool(info.get("masked")),
                           "tokenizer": str(info.get("tokenizer", ""))}}

    def _admit(self, node: int, info: dict[str, Any], models: Message | None) -> None:
        """Register a node under its partition: the partition must be free, and what every
        node must agree on (model size, data description, masking) must match the first
        admitted node's, the only one whose initial model and model size are taken."""
        client, agreed = info["client"], info["agreed"]
        if client in self.node_of:
            raise InvalidReply(f"partition-id {client} already joined as node "
                               f"{self.node_of[client]}")
        if self._reference is None:
            try:
                spec = DataSpec.from_dict(json.loads(agreed["data"]))
            except (ValueError, TypeError, KeyError) as err:
                raise InvalidReply(f"unreadable data description ({err})") from None
            if agreed["update-size"] < 1:
                raise InvalidReply(f"update-size {agreed['update-size']} is not positive")
            self._update_size = agreed["update-size"]
            if models is not None:
                self._initial = self._models(models, 1)[0]
                self._tokenizer = self._tokenizer_of(models, agreed["tokenizer"])
            self._data_spec, self._masked = spec, agreed["masked"]
            self._reference, self._agreed, self._first_node = client, agreed, node
        elif agreed != self._agreed:
            differs = next(k for k in agreed if agreed[k] != self._agreed[k])
            raise InvalidReply(f"{differs} differs from partition {self._reference}'s")
        self.node_of[client] = node
        self.client_of[node] = client
        self.declared[client] = info["examples"]
        self._groups[client] = info["group"]

    @staticmethod
    def _tokenizer_of(reply: Message, digest: str) -> str | None:
        """The tokenizer the first node sent with its initial model, checked against the digest
        every node declared (None: not text). Raises InvalidReply."""
        if not digest:
            return None
        record = reply.content.config_records.get("tokenizer")
        raw = str(record.get("json", "")) if record is not None else ""
        if hashlib.sha256(raw.encode()).hexdigest() != digest:
            raise InvalidReply("the tokenizer sent is not the one its digest names")
        return raw

    def _models(self, reply: Message, count: int) -> torch.Tensor:
        """`count` initial models from a query reply, checked like any reply."""
        if reply.has_error():
            raise InvalidReply(f"node error: {reply.error.reason}")
        if "models" not in reply.content.array_records:
            raise InvalidReply("no initial models")
        models = record_tensors(reply.content.array_records["models"]).get("models")
        if models is None or models.dtype != self.dtype or models.dim() != 2 \
                or len(models) != count or models.shape[1] < self._update_size \
                or not torch.isfinite(models).all():
            raise InvalidReply(f"initial models are not {count} finite parameter vectors")
        return models

    # -- Engine --------------------------------------------------------------------------
    @property
    def num_clients(self) -> int:
        return self.expected

    @property
    def update_size(self) -> int:
        return self._update_size

    @property
    def true_groups(self) -> np.ndarray | None:
        """None when a node does not know its group (it serves its own files): no ARI."""
        return None if (self._groups < 0).any() else self._groups

    @property
    def executor_name(self) -> str:
        return "flower"

    @property
    def tokenizer(self) -> str | None:
        return self._tokenizer

    @property
    def data_spec(self) -> DataSpec:
        return self._data_spec

    def initial_models(self, count: int) -> torch.Tensor:
        """The first is the handshake's; more are asked of the node that sent it (they must be
        made where the mask is known)."""
        if count <= 1 and self._initial is not None:
            return self._initial[None].clone()
        ask = Message(RecordDict({"ask": ConfigRecord({"initial-models": count})}),
                      self._first_node, "query")
        reply = next(iter(self.grid.send_and_receive([ask], timeout=self.connect_timeout)), None)
        try:
            if reply is None:
                raise InvalidReply("no answer")
            return self._models(reply, count)
        except InvalidReply as err:
            raise FedflockError(f"flower: node {self._first_node} failed to send {count} "
                                f"initial models: {err}") from None

    def model_handle(self) -> ModelHandle | None:
        if self._masked:
            return None
        spec = self._data_spec
        return ModelHandle(lambda: build_model(self.model_cfg, spec), self.dtype,
                           spec.input_shape)

    def _send(self, messages: list[Message]) -> list[Message]:
        online = set(self.grid.get_node_ids())
        live = [m for m in messages if m.metadata.dst_node_id in online]
        return list(self.grid.send_and_receive(live, timeout=self.timeout)) if live else []

    def _run_bundles(self, rnd: int, bundles: list[list[Task]]) -> dict[int, list[Reply]]:
        """One message per bundle (the tasks of one client); the replies of every client that
        answered all of its tasks readably. A client without a node is missing."""
        sent = {b[0].client: len(b) for b in bundles}
        messages = [Message(task_content(b), self.node_of[b[0].client], message_type(b))
                    for b in bundles if b[0].client in self.node_of]
        replies: dict[int, list[Reply]] = {}
        for message in self._send(messages):
            client = self.client_of.get(message.metadata.src_node_id)
            if client is None:  # the SuperLink answering for a node it lost: counted missing
                log.warning("round %d: %s", rnd, message.error.reason if message.has_error()
                            else "a reply from an unknown node")
                continue
            try:
                if client not in sent or client in replies:
                    raise InvalidReply("a reply to no task" if client not in sent
                                       else "a second reply to one message")
                replies[client] = replies_from_message(message, client, sent[client])
            except InvalidReply as err:
                self.refuse(rnd, client, str(err))
        return replies

    def run_tasks(self, rnd: int, tasks: list[Task]) -> list[Reply]:
        """Replies of the clients that answered; a client without a node is missing."""
        replies = self._run_bundles(rnd, [[t] for t in tasks])
        return [replies[c][0] for c in sorted(replies)]

    def run_together(self, rnd: int, lists: list[list[Task]]) -> list[list[Reply]]:
        """Each client's tasks of all lists in one message, so a round is one round trip."""
        bundles: dict[int, list[tuple[int, Task]]] = {}  # client -> (list index, task)
        for index, tasks in enumerate(lists):
            for task in tasks:
                bundles.setdefault(task.client, []).append((index, task))
        replies = self._run_bundles(rnd, [[t for _, t in b] for b in bundles.values()])
        out: list[list[Reply]] = [[] for _ in lists]
        for client in sorted(replies):
            for (index, _), reply in zip(bundles[client], replies[client], strict=True):
                out[index].append(reply)
        return out
