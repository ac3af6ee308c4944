"""Local training, shared by every executor so they compute the same updates.

SGD is written out (`sgd_step`) rather than taken from `torch.optim` so that the per-client loop
and the batched (`torch.func.vmap`) executor run literally the same arithmetic.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedflock.client.objectives import Classification, Objective
from fedflock.config import TrainingConfig
from fedflock.models.flat import FlatSpec

if TYPE_CHECKING:
    from fedflock.privacy import ClientDP


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


@dataclass(frozen=True)
class Proximal:
    """A proximal term mu/2 * sum_k w_k ||theta - c_k||^2 on the trainable parameters (FedProx:
    one centre, the model received; FedSoft: the cluster models weighted by importance)."""

    mu: float
    centres: torch.Tensor  # (K, P) flat vectors; only the trainable block is used
    weights: torch.Tensor  # (K,)

    def gradient(self, spec: FlatSpec, dtype: torch.dtype
                 ) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
        """d/dtheta of the term per trainable tensor, mu * (sum_k w_k * theta - sum_k w_k c_k),
        with the weighted centre sum computed once for all the SGD steps."""
        w = self.weights.to(dtype)
        pulled = spec.split((w[:, None] * self.centres.to(dtype)).sum(0))
        centre = [pulled[n] for n in spec.names[: spec.num_params]]
        total = float(w.sum())
        return lambda params: [self.mu * (total * p - c)
                               for p, c in zip(params, centre, strict=True)]


def trained_parts(spec: FlatSpec, trainable: torch.Tensor | None) -> list[torch.Tensor] | None:
    """Per parameter tensor, which of its entries a step may change, from a flat mask over the
    model vector (nonzero = trained); None when every entry is."""
    if trainable is None:
        return None
    parts = spec.split(trainable.to(torch.float64))
    return [parts[name] != 0 for name in spec.names[: spec.num_params]]


def _apply(param: torch.Tensor, new: torch.Tensor, trained: torch.Tensor | None) -> None:
    """`param` <- `new`, where it is trained (a held entry keeps its value: no step, no weight
    decay)."""
    param.copy_(new if trained is None else torch.where(trained, new, param))


def train_model(model: nn.Module, spec: FlatSpec, start: torch.Tensor, x: torch.Tensor,
                y: torch.Tensor, cfg: TrainingConfig, seed: int, epochs: int | None = None,
                objective: Objective | None = None, sample_weights: torch.Tensor | None = None,
                proximal: Proximal | None = None, trainable: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, float]:
    """Local SGD from `start`; returns (weight-update, mean training loss).

    `sample_weights` (one per training sample) weight the per-sample losses of a batch (their
    batch mean, as FedRC's responsibility-weighted loss); `proximal` adds its term's gradient;
    `trainable` (a flat mask, nonzero = trained) holds the other parameters fixed (FedBABU's
    head). Buffers such as BatchNorm statistics follow the data either way.
    """
    objective = objective or Classification()
    spec.load(model, start)
    model.train()
    params = [p for p in model.parameters()]
    trained = trained_parts(spec, trainable) or [None] * len(params)
    bufs: list[torch.Tensor | None] = [None] * len(params)
    pull = proximal.gradient(spec, start.dtype) if proximal is not None else None
    losses = []
    for idx in batch_schedule(len(y), cfg, seed, epochs):
        outputs = model(x[idx])
        if sample_weights is None:
            loss = objective.loss(outputs, y[idx])
        else:
            loss = (objective.losses(outputs, y[idx]) * sample_weights[idx]).mean()
        grads = torch.autograd.grad(loss, params)
        if pull is not None:
            with torch.no_grad():
                grads = tuple(g + q for g, q in zip(grads, pull(params), strict=True))
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(params, grads, strict=True)):
                new, bufs[i] = sgd_step(p, g, bufs[i], cfg)
                _apply(p, new, trained[i])
        losses.append(loss.detach())
    return spec.flatten(model) - start, float(torch.stack(losses).mean())


def train_model_private(dp: ClientDP, model: nn.Module, spec: FlatSpec, start: torch.Tensor,
                        x: torch.Tensor, y: torch.Tensor, cfg: TrainingConfig, seed: int,
                        noise_seed: int, epochs: int | None = None,
                        objective: Objective | None = None,
                        sample_weights: torch.Tensor | None = None,
                        proximal: Proximal | None = None, single_step: bool = False,
                        trainable: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """DP-SGD from `start` (`privacy.dp.mechanism: dp-sgd`); returns (update, mean loss).

    Batches are Poisson samples (`dp.batches`); Opacus computes every sample's gradient, clips
    it, sums, adds the noise and divides by the expected batch size (`DPOptimizer.pre_step`);
    the step is `sgd_step`, as without DP. The proximal pull depends on no sample, so it is added
    after the noise. `single_step` gives -lr times one noised gradient (the gradient task).
    `trainable` holds the other parameters fixed, as in `train_model`.
    """
    objective = objective or Classification()
    module, inner = dp.module(model), dp.inner
    spec.load(inner, start)
    module.train()
    params = list(module.parameters())
    n = len(y)
    steps = 1 if single_step else dp.local_steps(n, epochs)
    optimizer = dp.optimizer(params, n, noise_seed)
    trained = trained_parts(spec, trainable) or [None] * len(params)
    bufs: list[torch.Tensor | None] = [None] * len(params)
    pull = proximal.gradient(spec, start.dtype) if proximal is not None else None
    losses = []
    with warnings.catch_warnings():  # hooks on a module whose input needs no gradient
        warnings.filterwarnings("ignore", message="Full backward hook")
        for idx in dp.batches(n, seed, steps):
            optimizer.zero_grad(set_to_none=True)
            per_sample = objective.losses(module(x[idx]), y[idx])
            if sample_weights is not None:
                per_sample = per_sample * sample_weights[idx]
            per_sample.sum().backward()
            optimizer.pre_step()
            with torch.no_grad():
                grads = [p.grad for p in params]
                if pull is not None:
                    grads = [g + q for g, q in zip(grads, pull(params), strict=True)]
                if single_step:
                    update = torch.zeros_like(start)
                    update[: spec.num_trainable] = -cfg.lr * torch.cat(
                        [g.reshape(-1) for g in grads])
                    return update, float(per_sample.detach().mean()) if len(idx) else 0.0
                for i, (p, g) in enumerate(zip(params, grads, strict=True)):
                    new, bufs[i] = sgd_step(p, g, bufs[i], cfg)
                    _apply(p, new, trained[i])
            if len(idx):
                losses.append(per_sample.detach().mean())
    optimizer.zero_grad(set_to_none=True)
    mean = float(torch.stack(losses).mean()) if losses else 0.0
    return spec.flatten(inner) - start, mean


def gradient_step(model: nn.Module, spec: FlatSpec, start: torch.Tensor, x: torch.Tensor,
                  y: torch.Tensor, cfg: TrainingConfig, objective: Objective | None = None
                  ) -> tuple[torch.Tensor, float]:
    """-lr times the full-batch gradient at `start` (buffers unchanged)."""
    objective = objective or Classification()
    spec.load(model, start)
    model.eval()  # BN uses its running statistics: the gradient of the model as sent
    loss = objective.loss(model(x), y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    update = torch.zeros_like(start)
    update[: spec.num_trainable] = -cfg.lr * torch.cat([g.reshape(-1) for g in grads])
    return update, float(loss.detach())


Statistic = Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]


@torch.no_grad()
def per_sample(model: nn.Module, x: torch.Tensor, y: torch.Tensor, statistic: Statistic,
               chunk: int = 256) -> dict[str, torch.Tensor]:
    """`statistic(outputs, targets)` of `model` in eval mode over (x, y), in chunks, joined
    per sample; {} without samples."""
    model.eval()
    parts = [statistic(model(x[s : s + chunk]), y[s : s + chunk])
             for s in range(0, len(y), chunk)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]} if parts else {}


def sample_stats(model: nn.Module, x: torch.Tensor, y: torch.Tensor, objective: Objective
                 ) -> dict[str, torch.Tensor]:
    """The objective's per-sample statistics (its metrics' ingredients)."""
    return per_sample(model, x, y, objective.sample_stats)


def sample_losses(model: nn.Module, x: torch.Tensor, y: torch.Tensor, objective: Objective
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample (prediction, loss)."""
    out = per_sample(model, x, y, lambda o, t: {"predicted": objective.predict(o),
                                                "loss": objective.losses(o, t)})
    if not out:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0)
    return out["predicted"], out["loss"]


def eval_layout(x: torch.Tensor) -> torch.Tensor:
    """Images in the channels-last layout of the evaluation copy of the model."""
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x
