"""Each stored client's k closest others, kept up to date as values arrive: the incremental
store's O(n k) stand-in for its n x n matrix when clients are many.

A round brings the values of the k_new sampled clients against all n stored ones (the store's
(k_new, n) block). Those clients' own lists are rebuilt from their full rows (exact: every
stored client is compared); every other client's list loses the entries of the re-sampled
clients (their old values are stale) and takes their new values where they are among its k
best. O(n (k + k_new)) per round. What a list may lack: a client pushed out of j's list by a
value that later went stale is not remembered, so j's list is the k best of the values j has
kept, not of all current ones — the pairs a k-nearest-neighbour graph needs are the close ones,
which are the ones kept.
"""

from __future__ import annotations

from typing import Any

import torch

CHUNK = 4096  # rows whose lists are updated together


class NeighbourLists:
    def __init__(self, k: int, is_similarity: bool) -> None:
        self.k, self.is_similarity = k, is_similarity
        self.index = torch.empty(0, k, dtype=torch.int64)  # -1: no neighbour
        self.value = torch.empty(0, k, dtype=torch.float32)

    @property
    def nbytes(self) -> int:
        return sum(t.element_size() * t.numel() for t in (self.index, self.value))

    def _worst(self) -> float:
        return -float("inf") if self.is_similarity else float("inf")

    def grow(self, size: int) -> None:
        have = len(self.index)
        if size <= have:
            return
        index = torch.full((size, self.k), -1, dtype=torch.int64)
        value = torch.full((size, self.k), self._worst(), dtype=torch.float32)
        index[:have], value[:have] = self.index, self.value
        self.index, self.value = index, value

    def _best(self, values: torch.Tensor, index: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, the k best of (values, index) candidates, best first."""
        k = min(self.k, values.shape[1])
        top, where = torch.topk(values, k, dim=1, largest=self.is_similarity, sorted=True)
        chosen = torch.gather(index, 1, where)
        unknown = ~torch.isfinite(top)
        chosen[unknown] = -1
        top[unknown] = self._worst()
        if k < self.k:  # fewer candidates than k: pad
            pad = self.k - k
            top = torch.cat([top, torch.full((len(top), pad), self._worst())], 1)
            chosen = torch.cat([chosen, torch.full((len(top), pad), -1)], 1)
        return top, chosen

    def update(self, rows: torch.Tensor, block: torch.Tensor) -> None:
        """`block` (len(rows), n): the new values of stored clients `rows` against the first
        n stored (self-pairs included; they are ignored)."""
        n = block.shape[1]
        self.grow(n)
        worst = self._worst()
        # unknown values (NaN, or an infinity some measure gave) are never anyone's neighbour
        block = torch.where(torch.isfinite(block), block.float(), worst)
        block[torch.arange(len(rows)), rows] = worst  # never one's own neighbour
        # everyone else: drop the stale entries, offer the new values (in chunks of rows, so
        # the candidates never take more than a few times the lists' own memory)
        for start in range(0, n, CHUNK):
            part = slice(start, min(n, start + CHUNK))
            stale = torch.isin(self.index[part], rows)
            candidates = torch.cat([self.value[part].masked_fill(stale, worst),
                                    block[:, part].T], 1)
            owners = torch.cat([self.index[part].masked_fill(stale, -1),
                                rows.expand(len(candidates), len(rows))], 1)
            self.value[part], self.index[part] = self._best(candidates, owners)
        # the sampled clients themselves: their full rows
        everyone = torch.arange(n).expand(len(rows), n)
        self.value[rows], self.index[rows] = self._best(block, everyone)

    def lists(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(neighbour indices, values) of the first n stored clients, best first."""
        return self.index[:n].clone(), self.value[:n].clone()

    def state_dict(self, n: int | None = None) -> dict[str, Any]:
        """The lists of the first n clients (all rows held when None), copied."""
        rows = slice(None) if n is None else slice(0, n)
        return {"k": self.k, "is_similarity": self.is_similarity,
                "index": self.index[rows].clone(), "value": self.value[rows].clone()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> NeighbourLists:
        lists = cls(state["k"], state["is_similarity"])
        lists.index, lists.value = state["index"], state["value"]
        return lists
