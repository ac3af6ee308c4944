"""Who the malicious clients are and the labels they train on (data poisoning).

It lives with the data (the bottom layer): the client runtime poisons its own data with it, and
the adversary, the experiment and the summaries all read the same seeded set.
"""

from __future__ import annotations

import numpy as np
import torch

from fedflock.config import AttackConfig
from fedflock.errors import ConfigError


def malicious_clients(attack: AttackConfig | None, num_clients: int, seed: int) -> list[int]:
    """The seeded set of malicious clients (round(fraction * clients) of them)."""
    if attack is None:
        return []
    k = round(attack.fraction * num_clients)
    if k >= num_clients:
        raise ConfigError(f"config: attack.fraction: {attack.fraction} of {num_clients} clients "
                          "leaves no benign client")
    rng = np.random.default_rng([seed, 7])
    return sorted(rng.choice(num_clients, size=k, replace=False).tolist())


def check_label_map(attack: AttackConfig, num_classes: int) -> None:
    bad = [c for pair in attack.label_map.items() for c in pair if not 0 <= c < num_classes]
    if bad:
        raise ConfigError(f"config: attack.label_map: class {bad[0]} outside 0..{num_classes - 1}")


def flip_labels(y: torch.Tensor, label_map: dict[int, int]) -> torch.Tensor:
    """`y` with every class in `label_map` replaced by its target."""
    lookup = torch.arange(int(max(y.max().item(), *label_map, *label_map.values())) + 1)
    for source, target in label_map.items():
        lookup[source] = target
    return lookup[y]
