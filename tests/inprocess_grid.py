"""A Flower Grid whose nodes run the real ClientApp in this process: the Flower engine and the
ClientApp end to end through the real codec, without processes (fast, deterministic)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedflock.engines.flower.clientapp import app

Tamper = Callable[[Message, Message], list[Message]]


class InProcessGrid:
    """`partitions`: node id -> the partition id it claims. `tamper[node]` rewrites what a node
    sends back (a list: nothing, one reply or several); `node_config[node]` adds to its node
    config. `sent` records the type of every message sent, in order."""

    def __init__(self, config: Path, partitions: dict[int, int],
                 tamper: dict[int, Tamper] | None = None,
                 node_config: dict[int, dict[str, str]] | None = None) -> None:
        self.partitions = partitions
        self.tamper = tamper or {}
        extra = node_config or {}
        self.contexts = {node: Context(run_id=1, node_id=node,
                                       node_config={"partition-id": p, **extra.get(node, {})},
                                       state=RecordDict(), run_config={"config": str(config)})
                         for node, p in partitions.items()}
        self.sent: list[str] = []

    def get_node_ids(self) -> list[int]:
        return list(self.partitions)

    def send_and_receive(self, messages: list[Message], timeout: float | None = None
                         ) -> list[Message]:
        out = []
        for message in messages:
            node = message.metadata.dst_node_id
            self.sent.append(message.metadata.message_type)
            TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, node
            reply = app(message, self.contexts[node])
            tamper = self.tamper.get(node)
            out.extend(tamper(message, reply) if tamper else [reply])
        TaskIdentity.node_id = 0
        return out
