"""The CFL parameter tree: every split keeps the model it split from and the clients' updates on
each edge, so a new client can later be routed to its cluster (the paper's Algorithm 4) by
computing its own update at each node's model and following the most similar edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fedflock.clustering.seeding import farthest_point_seeds
from fedflock.similarity import cosine_matrix
from fedflock.wire import Newcomer


@dataclass
class TreeNode:
    id: int
    parent: int | None
    members: list[int]
    split_round: int | None = None
    params: torch.Tensor | None = None  # the model at the split (None for a leaf)
    children: list[int] = field(default_factory=list)
    edge_updates: dict[int, torch.Tensor] = field(default_factory=dict)  # child -> (n, d)


def spread_rows(updates: torch.Tensor, limit: int | None) -> torch.Tensor:
    """At most `limit` rows of `updates`, the most mutually dissimilar (farthest-point seeding
    on their cosine matrix): a new client's best match among them is close to its best match
    among all, at a fixed cost per edge."""
    if limit is None or len(updates) <= limit:
        return updates.clone()
    keep = farthest_point_seeds(cosine_matrix(updates, updates).numpy(), limit)
    return updates[sorted(keep)].clone()


class ParameterTree:
    """`max_edge_updates` bounds the updates kept on each edge (None keeps all, as the paper)."""

    def __init__(self, max_edge_updates: int | None = None) -> None:
        self.nodes: dict[int, TreeNode] = {}
        self.max_edge_updates = max_edge_updates

    def add_root(self, node_id: int, members: list[int]) -> None:
        self.nodes[node_id] = TreeNode(node_id, None, list(members))

    def record_split(self, parent: int, round_: int, params: torch.Tensor,
                     children: list[tuple[int, list[int], torch.Tensor]]) -> None:
        node = self.nodes[parent]
        node.split_round, node.params = round_, params.clone()
        for child_id, members, updates in children:
            self.nodes[child_id] = TreeNode(child_id, parent, list(members))
            node.children.append(child_id)
            node.edge_updates[child_id] = spread_rows(updates, self.max_edge_updates)

    @property
    def root(self) -> int:
        return next(n.id for n in self.nodes.values() if n.parent is None)

    def leaves(self) -> list[int]:
        return [n.id for n in self.nodes.values() if not n.children]

    def step(self, node_id: int, update: torch.Tensor) -> tuple[int, dict[int, float]]:
        """The child of an inner node whose edge holds the update most similar to `update`
        (the client's update at that node's model), and the similarity to each edge."""
        node = self.nodes[node_id]
        row = update.reshape(1, -1)
        scores = {child: float(cosine_matrix(row, node.edge_updates[child]).max())
                  for child in node.children}
        return max(scores, key=lambda c: scores[c]), scores

    def route(self, client: Newcomer) -> tuple[int, list[dict]]:
        """Leaf id for a new client, from its update at each inner node's model on the way
        down, and the similarity to each edge at every step (for explaining the decision)."""
        node = self.nodes[self.root]
        path: list[dict] = []
        while node.children:
            assert node.params is not None
            best, scores = self.step(node.id, client.update_at(node.params))
            path.append({"node": node.id, "similarity": scores, "chosen": best})
            node = self.nodes[best]
        return node.id, path

    def to_dict(self) -> dict[str, Any]:
        return {nid: vars(n).copy() for nid, n in self.nodes.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], max_edge_updates: int | None = None
                  ) -> ParameterTree:
        tree = cls(max_edge_updates)
        tree.nodes = {int(k): TreeNode(**v) for k, v in data.items()}
        return tree

    def describe(self) -> list[dict[str, Any]]:
        """JSON-friendly nodes (no tensors) for summary.json and the report."""
        return [
            {"id": n.id, "parent": n.parent, "members": n.members, "split_round": n.split_round,
             "children": n.children}
            for n in sorted(self.nodes.values(), key=lambda n: n.id)
        ]
