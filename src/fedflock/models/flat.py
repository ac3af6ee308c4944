"""A model as one flat vector: what the server averages, compares and stores.

The vector holds every trainable parameter followed by the floating-point buffers (BatchNorm
running statistics). Only the trainable part forms the "update" used for similarity and norms:
running statistics have a different scale and would swamp the cosine (FINDINGS: BN buffers
made every update norm about 30). Integer buffers (batch counters) are not federated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class FlatSpec:
    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    num_trainable: int  # length of the leading trainable block
    size: int
    num_params: int  # how many of `names` are parameters (the rest are buffers)

    @classmethod
    def of(cls, model: nn.Module) -> FlatSpec:
        params = list(model.named_parameters())
        buffers = [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]
        entries = params + buffers
        return cls(
            names=tuple(n for n, _ in entries),
            shapes=tuple(t.shape for _, t in entries),
            num_trainable=sum(p.numel() for _, p in params),
            size=sum(t.numel() for _, t in entries),
            num_params=len(params),
        )

    @property
    def has_buffers(self) -> bool:
        return self.size > self.num_trainable

    def flatten(self, model: nn.Module) -> torch.Tensor:
        state = dict(model.named_parameters()) | dict(model.named_buffers())
        return torch.cat([state[n].detach().reshape(-1) for n in self.names])

    def split(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of `vector` (last dim) as named tensors; leading dims are kept (batched)."""
        out, offset = {}, 0
        lead = vector.shape[:-1]
        for name, shape in zip(self.names, self.shapes, strict=True):
            n = shape.numel()
            out[name] = vector[..., offset : offset + n].reshape(*lead, *shape)
            offset += n
        return out

    def load(self, model: nn.Module, vector: torch.Tensor) -> None:
        tensors = self.split(vector)
        state = dict(model.named_parameters()) | dict(model.named_buffers())
        with torch.no_grad():
            for name, value in tensors.items():
                state[name].copy_(value)
