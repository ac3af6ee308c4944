"""Detection of abnormal clients by the reconstruction error of an autoencoder (Li et al. 2019,
"Abnormal Client Behavior Detection in Federated Learning", arXiv 1910.09933): each uploaded
update is reduced to a low-dimensional surrogate, an autoencoder reconstructs the surrogates, the
clients whose error exceeds the round's mean error are excluded, and the rest are averaged
FedAvg-style (weighted by example counts).

Where this departs from the paper, and why (only its abstract could be checked):
- Surrogate: a seeded count sketch (feature hashing) of the update to `dim` = 256 coordinates:
  every parameter is added, with a random sign, to one random bucket. It is a Johnson-Lindenstrauss
  type projection (inner products and distances are preserved in expectation) that costs O(P) time
  and memory, where a dense Gaussian projection of a 1e6-parameter model to 256 dimensions would
  be a 1 GiB matrix. The paper's surrogate is its own low-dimensional embedding; any
  distance-preserving one serves the detector the same way. Surrogates are divided by the round's
  median surrogate norm, so the detector sees inputs of order one whatever the learning rate.
- Training: the paper pre-trains the detector on benign updates, which a server here does not
  have. The autoencoder is trained online, from a seeded initialisation, on the round's own
  surrogates. Trained on every surrogate with a squared loss it would spend its capacity on the
  largest (most anomalous) ones and reconstruct them best, so each step fits only the share
  `fit_share` (default half) of the surrogates it currently reconstructs best — a least trimmed
  squares objective standing in for "benign data only" (`fit_share` = 1 is plain online training).
- Threshold: the mean reconstruction error of the round (the paper's dynamic threshold); a client
  strictly above it is excluded. At least one client is therefore always kept, and when no attack
  is present the clients above the mean are still dropped, as in the paper.
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch

SKETCH_COLUMNS = 2**16  # coordinates hashed per step (bounds the float64 copy of a block)


def count_sketch(updates: torch.Tensor, dim: int, seed: int) -> torch.Tensor:
    """Seeded count sketch (n, dim) of the rows of `updates` (n, P), in float64."""
    n, size = updates.shape
    gen = torch.Generator().manual_seed(seed)
    bucket = torch.randint(dim, (size,), generator=gen).to(updates.device)
    sign = (torch.randint(2, (size,), generator=gen) * 2 - 1).double().to(updates.device)
    out = torch.zeros(n, dim, dtype=torch.float64, device=updates.device)
    for lo in range(0, size, SKETCH_COLUMNS):
        cols = slice(lo, lo + SKETCH_COLUMNS)
        out.index_add_(1, bucket[cols], updates[:, cols].double() * sign[cols])
    return out


def _layer(fan_in: int, fan_out: int, gen: torch.Generator) -> list[torch.Tensor]:
    bound = 1 / math.sqrt(fan_in)  # torch.nn.Linear's default initialisation
    weight = (torch.rand(fan_in, fan_out, generator=gen, dtype=torch.float64) * 2 - 1) * bound
    bias = (torch.rand(fan_out, generator=gen, dtype=torch.float64) * 2 - 1) * bound
    return [weight.requires_grad_(), bias.requires_grad_()]


def reconstruction_errors(surrogates: torch.Tensor, hidden: int = 64, code: int = 8,
                          steps: int = 200, lr: float = 0.01, fit_share: float = 0.5,
                          seed: int = 0) -> torch.Tensor:
    """Per-row mean squared reconstruction error (n,) of an autoencoder dim→hidden→code→hidden→dim
    (ReLU between layers), trained by full-batch Adam for `steps` on the rows themselves, each
    step on the `fit_share` of rows it reconstructs best."""
    x = surrogates.detach().double().cpu()
    n, dim = x.shape
    gen = torch.Generator().manual_seed(seed)
    sizes = [dim, hidden, code, hidden, dim]
    params = [p for a, b in pairwise(sizes) for p in _layer(a, b, gen)]

    def forward() -> torch.Tensor:
        h = x
        for k in range(0, len(params), 2):
            h = h @ params[k] + params[k + 1]
            if k + 2 < len(params):
                h = h.relu()
        return (h - x).pow(2).mean(1)

    fitted = max(1, math.ceil(fit_share * n))
    # Matrices of a few thousand entries: intra-op threads only add synchronisation (ten times
    # slower on a busy machine), so the training runs on one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.enable_grad():
            optimiser = torch.optim.Adam(params, lr=lr)
            for _ in range(steps):
                errors = forward()
                loss = errors.sort().values[:fitted].mean()
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        with torch.no_grad():
            return forward()
    finally:
        torch.set_num_threads(threads)


def credit(updates: torch.Tensor, weights: torch.Tensor, *, detect: torch.Tensor | None = None,
           dim: int = 256, hidden: int = 64, code: int = 8, steps: int = 200, lr: float = 0.01,
           fit_share: float = 0.5, seed: int = 0
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean of the rows of `updates` (n, P) not flagged as abnormal, weighted by `weights` (n,)
    (example counts). Detection looks at `detect` (default: the updates; e.g. their trainable
    part). Returns (aggregate, kept mask (n,), reconstruction errors (n,))."""
    n = len(updates)
    sketch = count_sketch(updates if detect is None else detect, dim, seed)
    scale = sketch.norm(dim=1).median()
    if n < 2 or not scale > 0:  # nothing to compare, or no update moved at all
        kept = torch.ones(n, dtype=torch.bool)
        errors = torch.zeros(n, dtype=torch.float64)
    else:
        errors = reconstruction_errors(sketch / scale, hidden, code, steps, lr, fit_share, seed)
        kept = errors <= errors.mean()
        kept[errors.argmin()] = True  # the minimum is never above the mean, even after rounding
    w = weights.double().cpu() * kept
    w = w / w.sum() if w.sum() > 0 else kept.double() / kept.sum()
    acc = torch.zeros(updates.shape[1], dtype=torch.float64, device=updates.device)
    for i in range(n):  # row by row: every coordinate sums in the same order
        if kept[i]:
            acc.add_(updates[i].double(), alpha=float(w[i]))
    return acc.to(updates.dtype), kept, errors
