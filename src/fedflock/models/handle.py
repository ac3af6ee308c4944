"""A server-side handle on the model behind the flat vectors: build a module, read its layout.

Algorithms that must run the models they aggregate (DistFL) or aggregate parameter blocks over
different client sets (FedDAG, LG-style heads) get one through their context. Under permutation
masking the server cannot know which coordinate is which, so no handle exists there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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

    def layers(self) -> list[str]:
        """The modules holding trainable parameters, in the order of the flat vector (a block
        `"4.weight"` belongs to layer `"4"`): what partial-sharing methods name parts by."""
        return list(dict.fromkeys(_layer(b.name) for b in self.blocks if b.trainable))

    def mask(self, layers: Iterable[str]) -> torch.Tensor:
        """The coordinates (bool, P) of the named layers' blocks, their buffers included (a
        BatchNorm layer's running statistics go with its weights). An unknown name is a
        ValueError listing the layers."""
        wanted, known = set(layers), self.layers()
        if unknown := sorted(wanted - set(known)):
            raise ValueError(f"no layer {', '.join(unknown)} in the model (layers: "
                             f"{', '.join(known)})")
        out = torch.zeros(self.spec.size, dtype=torch.bool)
        for block in self.blocks:
            if _layer(block.name) in wanted:
                out[block.start : block.stop] = True
        return out

    def module(self, vector: torch.Tensor | None = None) -> nn.Module:
        """A fresh torch module holding `vector` (a new initialisation when None)."""
        model = self._build().to(self.dtype)
        if vector is not None:
            self.spec.load(model, vector.to(self.dtype))
        return model

    def vector(self, model: nn.Module) -> torch.Tensor:
        return self.spec.flatten(model)


def _layer(block: str) -> str:
    return block.rsplit(".", 1)[0]
