"""FedDAG's dual encoder: two copies of a model's feature layers whose features are
concatenated before one classifier. A method can then aggregate the two encoders over
different client sets (FedDAG: the primary within the cluster, the secondary with the
complementary clusters too); trained locally, the model is an ordinary module.

Any model of the zoo qualifies: each is a sequence of layers ending in its linear classifier,
and the encoder is everything before it. The two copies start from different draws (a copy
that starts equal would only drift apart through the clients its secondary is shared with).
Blocks are named `primary.*`, `secondary.*` and `head.*` (`ModelHandle.layers`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fedflock.errors import ConfigError


class DualEncoder(nn.Module):
    def __init__(self, primary: nn.Module, secondary: nn.Module, features: int,
                 classes: int) -> None:
        super().__init__()
        self.primary, self.secondary = primary, secondary
        self.head = nn.Linear(2 * features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.primary(x), self.secondary(x)], dim=-1))


def dual_encoder(build: Callable[[], nn.Module], name: str) -> DualEncoder:
    """Two encoders from two builds of the model `name`, and a classifier over both."""
    first, second = build(), build()
    if not (isinstance(first, nn.Sequential) and isinstance(first[-1], nn.Linear)):
        raise ConfigError(f"config: model.dual_encoder: model {name!r} is not a sequence of "
                          "layers ending in a linear classifier, so it has no encoder to copy")
    classifier = first[-1]
    assert isinstance(classifier, nn.Linear)
    return DualEncoder(first[:-1], second[:-1], classifier.in_features,
                       classifier.out_features)
