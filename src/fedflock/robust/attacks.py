"""Malicious clients: who they are, the labels they train on, and what they send.

The adversary is part of the simulated world, not of any algorithm: data poisoning happens where
the client's data live (`ClientRuntime`), model poisoning between the clients and the server
(`Engine`), so every algorithm and every engine faces the same attack. Colluding attackers
coordinate through a side channel: they send one common vector per round.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from fedflock.config import AttackConfig
from fedflock.registry import Registry
from fedflock.wire import Reply

# A model-poisoning rule maps the malicious clients' honest updates (n, P) of one round to what
# they send instead, given the attack, a seeded generator and the number of replies that round.
Poisoning = Callable[[torch.Tensor, AttackConfig, torch.Generator, int], torch.Tensor]
POISONINGS: Registry[Poisoning] = Registry("model poisoning")


def _common(updates: torch.Tensor, attack: AttackConfig) -> torch.Tensor:
    """Colluders agree on their mean; independent attackers keep their own."""
    return updates.mean(0, keepdim=True).expand_as(updates) if attack.colluding else updates


@POISONINGS.register("sign_flip", "the opposite of the honest update, times `scale`")
def _sign_flip(updates: torch.Tensor, attack: AttackConfig, gen: torch.Generator,
               replies: int) -> torch.Tensor:
    return -(attack.scale or 1.0) * _common(updates, attack)


@POISONINGS.register("zero", "an all-zero update (a free rider)")
def _zero(updates: torch.Tensor, attack: AttackConfig, gen: torch.Generator,
          replies: int) -> torch.Tensor:
    return torch.zeros_like(updates)


@POISONINGS.register("random", "Gaussian noise, `scale` times the honest norm")
def _random(updates: torch.Tensor, attack: AttackConfig, gen: torch.Generator,
            replies: int) -> torch.Tensor:
    rows = 1 if attack.colluding else len(updates)
    noise = torch.randn(rows, updates.shape[1], generator=gen, dtype=torch.float64)
    noise = noise.to(updates.dtype).expand_as(updates)
    target = updates.norm(dim=1, keepdim=True)
    if attack.colluding:
        target = target.mean().expand_as(target)
    norms = target / noise.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return (attack.scale or 1.0) * noise * norms


@POISONINGS.register("model_replacement", "a poisoned update boosted to replace the aggregate")
def _model_replacement(updates: torch.Tensor, attack: AttackConfig, gen: torch.Generator,
                       replies: int) -> torch.Tensor:
    boost = attack.scale or replies / len(updates)
    return boost * _common(updates, attack)


class Adversary:
    """Replaces the replies of malicious clients by poisoned ones (model poisoning kinds).

    Only the trainable block (`update_size` entries) is poisoned; BatchNorm buffers keep their
    honest deltas (a flipped or noisy running variance would just break the model, not attack it).
    """

    def __init__(self, attack: AttackConfig, malicious: list[int], seed: int,
                 update_size: int | None = None) -> None:
        self.attack = attack
        self.malicious = set(malicious)
        self.seed = seed
        self.update_size = update_size
        self.poison = POISONINGS.get(attack.kind) if attack.poisons_model else None

    def __call__(self, rnd: int, replies: list[Reply]) -> list[Reply]:
        bad = [i for i, r in enumerate(replies)
               if r.client in self.malicious and "update" in r.tensors]
        if self.poison is None or not bad or rnd < self.attack.start_round:
            return replies
        gen = torch.Generator().manual_seed(int(np.random.default_rng([self.seed, 9, rnd])
                                                .integers(2**62)))
        # Updates of select tasks are relative to different models; collusion still averages them.
        size = self.update_size or replies[bad[0]].update.numel()
        honest = torch.stack([replies[i].update[:size] for i in bad])
        poisoned = self.poison(honest, self.attack, gen, len(replies))
        out = list(replies)
        for row, i in enumerate(bad):
            r = replies[i]
            update = r.update.clone()
            update[:size] = poisoned[row]
            out[i] = r.with_tensors(update=update)
        return out
