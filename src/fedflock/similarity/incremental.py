"""A similarity matrix filled incrementally from the clients sampled round after round.

The server keeps the most recent update of every client it has seen. When k new updates arrive
they are compared with each other and with the n stored ones (one (k, n) matrix product: O(k n d)
per round, never the full n x n recomputation), and the new values overwrite the old ones of
those pairs. Clients never seen have no row. Storage grows by doubling, so memory is O(n d + n^2)
in the clients seen so far, not in all clients.

Sketching (`sketch=m`). Storing every client's full update is O(n d): 10,000 clients of a
79,510-parameter MLP already hold 3 GB. With a sketch the store keeps a seeded count sketch of
each update instead (Charikar et al. 2002; each coordinate hashed to one of m buckets with a
random sign, so one O(d) pass per update and O(d) memory for the hash): inner products, and so
norms, cosines and Euclidean distances, are preserved in expectation, with a standard error of
about sqrt((1 + cos^2) / m) on a cosine (0.016-0.022 at m = 4,096) whatever d is. Manhattan
distances are not preserved, so that measure refuses a sketch.

Neighbour lists (`neighbours=k`). The n x n matrix is O(n^2): 40 GB at 100,000 clients. With
`neighbours` the store keeps, instead, each client's k closest others
(`fedflock.similarity.neighbours.NeighbourLists`, O(n k)), from which the clustering builds a
sparse k-nearest-neighbour graph; values between any other clients are recomputed from the
stored updates when asked (`among`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fedflock.registry import Registry
from fedflock.similarity.neighbours import NeighbourLists

# A measure compares rows of `new` (k, d) with rows of `stored` (n, d); `new_sq`/`stored_sq` are
# the squared row norms (kept by the store). Values are similarities (higher = closer) or
# distances (lower = closer), as the registry entry says.
Measure = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
MEASURES: Registry[tuple[Measure, bool]] = Registry("similarity measure")


def _cosine(new, stored, new_sq, stored_sq):
    denom = (new_sq.sqrt()[:, None] * stored_sq.sqrt()[None, :]).clamp_min(1e-30)
    return ((new @ stored.T) / denom).clamp_(-1.0, 1.0)


def _euclidean(new, stored, new_sq, stored_sq):
    return (new_sq[:, None] + stored_sq[None, :] - 2 * new @ stored.T).clamp_min_(0).sqrt_()


def _manhattan(new, stored, new_sq, stored_sq):
    return torch.cdist(new, stored, p=1)


MEASURES.register("cosine", "cosine similarity of updates (the default)")((_cosine, True))
MEASURES.register("euclidean", "Euclidean distance of updates")((_euclidean, False))
MEASURES.register("manhattan", "Manhattan (L1) distance of updates")((_manhattan, False))


SKETCHABLE = ("cosine", "euclidean")


class CountSketch:
    """A seeded linear map R^d -> R^m: coordinate i goes to bucket h(i) with sign s(i)."""

    def __init__(self, dim: int, size: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.dim, self.size, self.seed = dim, size, seed
        self.bucket = torch.randint(size, (dim,), generator=gen)
        self.sign = torch.randint(2, (dim,), generator=gen).float().mul_(2).sub_(1)

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(rows), self.size, dtype=torch.float32)
        return out.index_add_(1, self.bucket, rows.float() * self.sign)


class IncrementalSimilarity:
    def __init__(self, measure: str = "cosine", max_clients: int | None = None,
                 sketch: int | None = None, sketch_seed: int = 0,
                 neighbours: int | None = None) -> None:
        self.max_clients = max_clients  # the storage never grows past this many rows
        self.measure_name = measure
        self.measure, self.is_similarity = MEASURES.get(measure)
        if sketch is not None and measure not in SKETCHABLE:
            raise ValueError(f"a sketch preserves inner products, not {measure} distances "
                             f"(sketchable: {', '.join(SKETCHABLE)})")
        self.sketch_size, self.sketch_seed = sketch, sketch_seed
        self._sketch: CountSketch | None = None
        self.slot: dict[int, int] = {}  # client -> row
        self.clients: list[int] = []  # row -> client
        self.updates = torch.empty(0, 0)
        self.sq = torch.empty(0, dtype=torch.float64)
        self.matrix = torch.empty(0, 0)
        self.lists = NeighbourLists(neighbours, self.is_similarity) if neighbours else None

    def __len__(self) -> int:
        return len(self.clients)

    @property
    def nbytes(self) -> int:
        held = sum(t.element_size() * t.numel() for t in (self.updates, self.sq, self.matrix))
        return held + (self.lists.nbytes if self.lists is not None else 0)

    def _grow(self, needed: int, dim: int) -> None:
        capacity = len(self.updates)
        if needed <= capacity:
            return
        size = max(needed, 2 * capacity, 16)
        if self.max_clients is not None:
            size = max(needed, min(size, self.max_clients))
        updates = torch.empty(size, dim, dtype=torch.float32)
        sq = torch.zeros(size, dtype=torch.float64)
        if capacity:
            updates[:capacity] = self.updates
            sq[:capacity] = self.sq
        self.updates, self.sq = updates, sq
        if self.lists is not None:
            self.lists.grow(size)
            return
        matrix = torch.full((size, size), float("nan"), dtype=torch.float32)
        if capacity:
            matrix[:capacity, :capacity] = self.matrix
        self.matrix = matrix

    def add(self, clients: list[int], updates: torch.Tensor) -> None:
        """Store the newest updates (k, d) of `clients` (or their sketches) and their values
        against everyone."""
        updates = self._sketched(updates.float())
        for c in clients:
            if c not in self.slot:
                self.slot[c] = len(self.clients)
                self.clients.append(c)
        self._grow(len(self.clients), updates.shape[1])
        rows = torch.tensor([self.slot[c] for c in clients])
        self.updates[rows] = updates
        self.sq[rows] = updates.double().pow(2).sum(1)
        n = len(self.clients)
        values = self.measure(updates, self.updates[:n], self.sq[rows].float(),
                              self.sq[:n].float())
        if self.lists is not None:
            self.lists.update(rows, values)
            return
        self.matrix[rows, :n] = values
        self.matrix[:n, rows] = values.T
        self.matrix[rows, rows] = 1.0 if self.is_similarity else 0.0

    def _sketched(self, updates: torch.Tensor) -> torch.Tensor:
        if self.sketch_size is None or self.sketch_size >= updates.shape[1]:
            return updates
        if self._sketch is None:
            self._sketch = CountSketch(updates.shape[1], self.sketch_size, self.sketch_seed)
        return self._sketch(updates)

    def values(self) -> tuple[list[int], torch.Tensor]:
        """(clients seen, in row order; their matrix of values)."""
        if self.lists is not None:
            raise RuntimeError("this store keeps neighbour lists, not the matrix")
        n = len(self.clients)
        return list(self.clients), self.matrix[:n, :n].clone()

    def neighbour_lists(self) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """(clients seen, in row order; each one's k closest others' rows and values)."""
        if self.lists is None:
            raise RuntimeError("this store keeps the matrix, not neighbour lists")
        return list(self.clients), *self.lists.lists(len(self.clients))

    def among(self, rows: list[int]) -> torch.Tensor:
        """The values between the stored clients at these rows, recomputed from their stored
        updates."""
        picked = torch.as_tensor(rows, dtype=torch.int64)
        values = self.measure(self.updates[picked], self.updates[picked],
                              self.sq[picked].float(), self.sq[picked].float())
        return values.fill_diagonal_(1.0 if self.is_similarity else 0.0)

    def release(self) -> None:
        """Drop the stored updates and the matrix or neighbour lists (the clients seen stay
        listed): once the clustering is done neither memory nor checkpoints should carry
        them."""
        self.updates = torch.empty(0, 0)
        self.sq = torch.empty(0, dtype=torch.float64)
        self.matrix = torch.empty(0, 0)
        if self.lists is not None:
            self.lists = NeighbourLists(self.lists.k, self.is_similarity)

    def state_dict(self) -> dict[str, Any]:
        n = len(self.clients)
        return {"measure": self.measure_name, "max_clients": self.max_clients,
                "sketch": self.sketch_size, "sketch_seed": self.sketch_seed,
                "clients": list(self.clients),
                "updates": self.updates[:n].clone(), "sq": self.sq[:n].clone(),
                "matrix": self.matrix[:n, :n].clone(),  # empty once released
                "lists": self.lists.state_dict(n) if self.lists is not None else None}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> IncrementalSimilarity:
        store = cls(state["measure"], state.get("max_clients"), state.get("sketch"),
                    state.get("sketch_seed", 0))
        store.clients = list(state["clients"])
        store.slot = {c: i for i, c in enumerate(store.clients)}
        store.updates, store.sq, store.matrix = state["updates"], state["sq"], state["matrix"]
        if state.get("lists") is not None:
            store.lists = NeighbourLists.from_state(state["lists"])
        return store
