"""A server-side handle on the model behind the flat vectors: build a module, read its layout.

Algorithms that must run the models they aggregate (DistFL) or aggregate parameter blocks over
different client sets (FedDAG, LG-style heads) get one through their context. Under permutation
masking the server cannot know which coordinate is which, so no handle exists there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from fedflock.models.flat import FlatSpec


@dataclass(frozen=True)
class Block:
    """One named tensor of the model inside the flat vector."""

    name: str
    shape: tuple[int, ...]
    start: int
    stop: int
    trainable: bool

    def of(self, vector: torch.Tensor) -> torch.Tensor:
        """This block's view of a flat vector (or of the last dim of a stack of them)."""
        return vector[..., self.start : self.stop]


class ModelHandle:
    """`input_shape` is the shape of one input sample (what server-side probes must look like)."""

    def __init__(self, build: Callable[[], nn.Module], dtype: torch.dtype = torch.float32,
                 input_shape: tuple[int, ...] | None = None) -> None:
        self._build = build
        self.dtype = dtype
        self.input_shape = input_shape
        self.spec = FlatSpec.of(build())

    @property
    def blocks(self) -> list[Block]:
        out, offset = [], 0
        for i, (name, shape) in enumerate(zip(self.spec.names, self.spec.shapes, strict=True)):
            n = shape.numel()
            out.append(Block(name, tuple(shape), offset, offset + n, i < self.spec.num_params))
            offset += n
        return out

    def module(self, vector: torch.Tensor | None = None) -> nn.Module:
        """A fresh torch module holding `vector` (a new initialisation when None)."""
        model = self._build().to(self.dtype)
        if vector is not None:
            self.spec.load(model, vector.to(self.dtype))
        return model

    def vector(self, model: nn.Module) -> torch.Tensor:
        return self.spec.flatten(model)
