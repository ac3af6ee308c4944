"""Local training, shared by every executor so they compute the same updates.

SGD is written out (`sgd_step`) rather than taken from `torch.optim` so that the per-client loop
and the batched (`torch.func.vmap`) executor run literally the same arithmetic.
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F
from torch import nn

from fedflock.config import TrainingConfig
from fedflock.models.flat import FlatSpec


def task_seed(seed: int, round_: int, client: int, salt: str = "train") -> int:
    digest = hashlib.blake2b(f"{salt}:{seed}:{round_}:{client}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def batch_schedule(n: int, cfg: TrainingConfig, seed: int, epochs: int | None = None
                   ) -> list[torch.Tensor]:
    """Index batches of one client's local training: reshuffled each epoch, seeded."""
    g = torch.Generator().manual_seed(seed)
    bs = min(cfg.batch_size, n)
    batches: list[torch.Tensor] = []
    steps = None if epochs is not None else cfg.local_steps
    total_epochs = epochs or cfg.local_epochs or 1
    while True:
        order = torch.randperm(n, generator=g)
        for start in range(0, n, bs):
            batches.append(order[start : start + bs])
            if steps is not None and len(batches) == steps:
                return batches
        if steps is None and len(batches) >= total_epochs * -(-n // bs):
            return batches


def sgd_step(param: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor | None,
             cfg: TrainingConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One SGD step with weight decay and (PyTorch-style) momentum; returns (param, buffer)."""
    d = grad + cfg.weight_decay * param if cfg.weight_decay else grad
    if cfg.momentum:
        buf = d if buf is None else cfg.momentum * buf + d
        d = buf
    return param - cfg.lr * d, buf


def train_model(model: nn.Module, spec: FlatSpec, start: torch.Tensor, x: torch.Tensor,
                y: torch.Tensor, cfg: TrainingConfig, seed: int, epochs: int | None = None
                ) -> tuple[torch.Tensor, float]:
    """Local SGD from `start`; returns (weight-update, mean training loss)."""
    spec.load(model, start)
    model.train()
    params = [p for p in model.parameters()]
    bufs: list[torch.Tensor | None] = [None] * len(params)
    losses = []
    for idx in batch_schedule(len(y), cfg, seed, epochs):
        loss = F.cross_entropy(model(x[idx]), y[idx])
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(params, grads, strict=True)):
                new, bufs[i] = sgd_step(p, g, bufs[i], cfg)
                p.copy_(new)
        losses.append(loss.detach())
    return spec.flatten(model) - start, float(torch.stack(losses).mean())


def gradient_step(model: nn.Module, spec: FlatSpec, start: torch.Tensor, x: torch.Tensor,
                  y: torch.Tensor, cfg: TrainingConfig) -> tuple[torch.Tensor, float]:
    """-lr times the full-batch gradient at `start` (buffers unchanged)."""
    spec.load(model, start)
    model.eval()  # BN uses its running statistics: the gradient of the model as sent
    loss = F.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    update = torch.zeros_like(start)
    update[: spec.num_trainable] = -cfg.lr * torch.cat([g.reshape(-1) for g in grads])
    return update, float(loss.detach())


@torch.no_grad()
def evaluate_model(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int = 256
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample (predicted class, loss) of `model` in eval mode."""
    model.eval()
    predicted, losses = [], []
    for s in range(0, len(y), chunk):
        logits = model(x[s : s + chunk])
        predicted.append(logits.argmax(1))
        losses.append(F.cross_entropy(logits, y[s : s + chunk], reduction="none"))
    if not predicted:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0)
    return torch.cat(predicted), torch.cat(losses)
