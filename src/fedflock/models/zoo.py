"""The models a config can name. Each builder takes the data description and the model config."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import nn

from fedflock.config import ModelConfig
from fedflock.data.spec import DataSpec
from fedflock.registry import Registry

Builder = Callable[[DataSpec, ModelConfig], nn.Module]
MODELS: Registry[Builder] = Registry("model")


@MODELS.register("mlp", "multi-layer perceptron, hidden sizes from model.hidden (default 100)")
def mlp(data: DataSpec, cfg: ModelConfig) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width, classes = math.prod(data.input_shape), data.num_classes
    for h in cfg.hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def _conv_stack(shape: tuple[int, ...], classes: int, batch_norm: bool) -> nn.Module:
    channels, height, _ = shape
    pools = 2 if height >= 16 else 1
    layers: list[nn.Module] = []
    c_in = channels
    for c_out in (16, 32)[:pools]:
        layers.append(nn.Conv2d(c_in, c_out, 3, padding=1))
        if batch_norm:
            layers.append(nn.BatchNorm2d(c_out))
        layers += [nn.ReLU(), nn.MaxPool2d(2)]
        c_in = c_out
    side = height // (2**pools)
    layers += [nn.Flatten(), nn.Linear(c_in * side * side, classes)]
    return nn.Sequential(*layers)


@MODELS.register("cnn", "small ConvNet: two 3x3 conv + max-pool blocks, linear head")
def cnn(data: DataSpec, cfg: ModelConfig) -> nn.Module:
    return _conv_stack(data.input_shape, data.num_classes, batch_norm=False)


@MODELS.register("cnn_bn", "the small ConvNet with BatchNorm after each conv (for DistFL)")
def cnn_bn(data: DataSpec, cfg: ModelConfig) -> nn.Module:
    return _conv_stack(data.input_shape, data.num_classes, batch_norm=True)


@MODELS.register("cfl_cnn", "the CFL paper's 5-layer CIFAR ConvNet (3 conv + 2 dense)")
def cfl_cnn(data: DataSpec, cfg: ModelConfig) -> nn.Module:
    (channels, height, _), classes = data.input_shape, data.num_classes
    side = height // 8
    return nn.Sequential(
        nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * side * side, 128), nn.ReLU(),
        nn.Linear(128, classes),
    )


def build_model(cfg: ModelConfig, data: DataSpec) -> nn.Module:
    return MODELS.get(cfg.name)(data, cfg)
