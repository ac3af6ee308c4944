"""Distribution knowledge of a model (DistFL): inputs synthesised from its BatchNorm statistics,
and how far apart models are in their responses to those inputs.

`synthesize_inputs` optimises z random inputs by gradient descent so that, at every BatchNorm
layer, the batch mean and variance of the features entering it match that layer's running mean
and variance (the DeepInversion feature-statistics loss), on the channels whose |BN scale| is in
the top `keep` share of their layer (keep = 0.5: at or above the layer's median, as the authors'
code). The model runs in eval mode (normalising with its running statistics) and is not changed.
Unlike the authors' public code, which builds this loss from detached numpy copies so that no
gradient reaches the inputs, the loss here is differentiable and the inputs really move
(`Synthesis.losses` records it falling).

`response_divergence` is the pairwise KL divergence of models' softmax responses on the same
inputs, averaged over the inputs: KL(P_i || P_j) (`symmetric=False`, the authors' form) or its
symmetrised mean (KL_ij + KL_ji) / 2.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from fedflock.models import ModelHandle

BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def batch_norm_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules() if isinstance(m, BN_TYPES)]


def important_channels(layer: nn.modules.batchnorm._BatchNorm, keep: float) -> torch.Tensor:
    """Boolean mask of the channels whose |scale| is in the top `keep` share of the layer (at
    least one channel; all when the layer has no affine scale)."""
    if layer.weight is None or keep >= 1:
        return torch.ones(layer.num_features, dtype=torch.bool)
    scale = layer.weight.detach().abs()
    cut = torch.quantile(scale.double(), 1 - keep).to(scale.dtype)
    mask = scale >= cut
    if not mask.any():
        mask[scale.argmax()] = True
    return mask


@dataclass
class Synthesis:
    inputs: torch.Tensor  # (z, *input_shape)
    losses: list[float]  # the BN-matching loss at every step, the first before any step


def synthesize_inputs(model: nn.Module, input_shape: tuple[int, ...], count: int = 200,
                      steps: int = 200, lr: float = 0.1, keep: float = 0.5, seed: int = 0
                      ) -> Synthesis:
    """`count` inputs whose features match `model`'s BatchNorm running statistics."""
    layers = batch_norm_layers(model)
    if not layers:
        raise ValueError("the model has no BatchNorm layer to synthesise inputs from")
    was_training = model.training
    model.eval()
    grads = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    masks = [important_channels(layer, keep) for layer in layers]
    terms: list[torch.Tensor] = []

    def hook(layer: nn.Module, mask: torch.Tensor):
        def record(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor
                   ) -> None:
            features = args[0]
            dims = [d for d in range(features.dim()) if d != 1]  # all but the channel axis
            mean = features.mean(dims)
            var = features.var(dims, unbiased=False)
            terms.append(torch.linalg.vector_norm((mean - module.running_mean)[mask])
                         + torch.linalg.vector_norm((var - module.running_var)[mask]))
        return record

    handles = [layer.register_forward_hook(hook(layer, mask))
               for layer, mask in zip(layers, masks, strict=True)]
    dtype = next(model.parameters()).dtype
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn((count, *input_shape), generator=generator, dtype=dtype)
    inputs.requires_grad_(True)
    optimiser = torch.optim.Adam([inputs], lr=lr)
    losses: list[float] = []
    try:
        for step in range(steps + 1):
            terms.clear()
            model(inputs)
            loss = torch.stack(terms).sum()
            losses.append(loss.item())
            if step == steps:
                break
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    finally:
        for handle in handles:
            handle.remove()
        for p, g in zip(model.parameters(), grads, strict=True):
            p.requires_grad_(g)
        model.train(was_training)
    return Synthesis(inputs.detach(), losses)


@torch.no_grad()
def responses(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """Softmax outputs (z, C) of `model` in eval mode."""
    was_training = model.training
    model.eval()
    try:
        return torch.softmax(model(inputs), dim=-1)
    finally:
        model.train(was_training)


def responses_of(handle: ModelHandle, vectors: Iterable[torch.Tensor], inputs: torch.Tensor
                 ) -> torch.Tensor:
    """(M, z, C): the responses of the model held by each flat vector, loaded in turn into one
    module (not a module built per model)."""
    model = handle.module()
    out = []
    for vector in vectors:
        handle.spec.load(model, vector.to(handle.dtype))
        out.append(responses(model, inputs))
    return torch.stack(out)


def response_divergence(probs: torch.Tensor, symmetric: bool = True, eps: float = 1e-12
                        ) -> torch.Tensor:
    """(M, M) mean KL divergence between the responses `probs` (M, z, C) of M models:
    entry (i, j) = mean over inputs of KL(P_i || P_j), symmetrised when `symmetric`."""
    p = probs.double().clamp_min(eps)
    log_p = p.log()
    own = (p * log_p).sum(-1).mean(-1)  # (M,) mean of sum_c p_i log p_i
    cross = torch.einsum("izc,jzc->ij", p, log_p) / p.shape[1]  # mean of sum_c p_i log p_j
    kl = (own[:, None] - cross).clamp_min(0)
    return (kl + kl.T) / 2 if symmetric else kl
