"""The models a config can name. Each builder takes the data description and the model config."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from fedflock.config import ModelConfig
from fedflock.data.spec import DataSpec
from fedflock.errors import ConfigError
from fedflock.models.dual import dual_encoder
from fedflock.registry import Registry

Builder = Callable[[DataSpec, ModelConfig], nn.Module]
MODELS: Registry[Builder] = Registry("model")


def _float_inputs(data: DataSpec, name: str) -> None:
    if data.integer_inputs:
        raise ConfigError(f"model.name: {name!r} takes float inputs; the dataset gives token "
                          "ids (use lstm_lm or transformer_lm)")


@MODELS.register("mlp", "multi-layer perceptron, hidden sizes from model.hidden (default 100)")
def mlp(data: DataSpec, cfg: ModelConfig) -> nn.Module:
    _float_inputs(data, "mlp")
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
    _float_inputs(data, "cnn")
    return _conv_stack(data.input_shape, data.num_classes, batch_norm=False)


@MODELS.register("cnn_bn", "the small ConvNet with BatchNorm after each conv (for DistFL)")
def cnn_bn(data: DataSpec, cfg: ModelConfig) -> nn.Module:
    _float_inputs(data, "cnn_bn")
    return _conv_stack(data.input_shape, data.num_classes, batch_norm=True)


@MODELS.register("cfl_cnn", "the CFL paper's 5-layer CIFAR ConvNet (3 conv + 2 dense)")
def cfl_cnn(data: DataSpec, cfg: ModelConfig) -> nn.Module:
    _float_inputs(data, "cfl_cnn")
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


# -- BatchNorm networks for DistFL: VGG-11, ResNet-18 and a 1-D CNN ---------------------------
# Written from the papers (Simonyan & Zisserman 2015, configuration "A" with BN; He et al. 2016,
# CIFAR variant). `model.width` scales every channel count; at width 1 they are the papers'.
# On a CPU use width 0.25 for vgg11_bn and resnet18 (about 1/16 of the parameters and
# multiply-adds); cnn1d_bn is small enough at width 1. Convs before a BN layer have no bias
# (the BN shift replaces it).
# A downsampling step (max-pool or stride 2) is skipped when the map after it would be smaller
# than 2 positions per side and more BN layers follow: a BN layer then always sees at least two
# values per channel, so a trailing batch of one sample still trains (BN refuses a single value).


def _channels(base: int, width: float) -> int:
    return max(1, round(base * width))


def _input_rank(data: DataSpec, name: str, rank: int, what: str) -> None:
    if data.integer_inputs or len(data.input_shape) != rank:
        raise ConfigError(f"model.name: {name!r} needs {what} inputs; the dataset gives "
                          f"{'token ids' if data.integer_inputs else 'shape'} "
                          f"{tuple(data.input_shape)}")


def _he_init(model: nn.Module) -> nn.Module:
    """He et al. (2015) normal init of the convolutions, BN scale 1 and shift 0 (both papers
    train from this; PyTorch's default conv init is a scaled uniform)."""
    for m in model.modules():
        if isinstance(m, nn.Conv1d | nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return model


VGG11_STAGES = ((64,), (128,), (256, 256), (512, 512), (512, 512))  # a max-pool after each


@MODELS.register("vgg11_bn", "VGG-11 with BatchNorm, global average pooling and one linear "
                 "layer (9.2M params at model.width 1; use 0.25 on a CPU)")
def vgg11_bn(data: DataSpec, cfg: ModelConfig) -> nn.Module:
    """VGG-11 ("A"): 8 conv3x3-BN-ReLU layers of 64, 128, 256x2, 512x2, 512x2 channels at width 1
    in five stages, each closed by a 2x2 max-pool; the three FC layers are replaced by global
    average pooling and one linear layer (a 32x32 input ends at 1x1 as in CIFAR VGGs). On 28x28
    the fourth pool is skipped (3x3 -> 1x1 with convs after it), see the note above."""
    _input_rank(data, "vgg11_bn", 3, "image (channels, height, width)")
    c_in, h, w = data.input_shape
    layers: list[nn.Module] = []
    for s, stage in enumerate(VGG11_STAGES):
        for base in stage:
            c_out = _channels(base, cfg.width)
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                       nn.ReLU()]
            c_in = c_out
        least = 1 if s == len(VGG11_STAGES) - 1 else 2  # no BN after the last pool
        if h // 2 >= least and w // 2 >= least:
            layers.append(nn.MaxPool2d(2))
            h, w = h // 2, w // 2
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, data.num_classes)]
    return _he_init(nn.Sequential(*layers))


class BasicBlock(nn.Module):
    """He et al.'s two-layer residual block; a 1x1 conv + BN projects the shortcut when the
    shape changes (their option B, as in their ImageNet ResNet-18; their own CIFAR nets
    ResNet-20..110 are narrower and pad with zeros, option A)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                          nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


@MODELS.register("resnet18", "ResNet-18, CIFAR variant: 3x3 stem, no max-pool, 4x2 basic "
                 "blocks (11.2M params at model.width 1; use 0.25 on a CPU)")
def resnet18(data: DataSpec, cfg: ModelConfig) -> nn.Module:
    """ResNet-18 for small images: a 3x3 stride-1 conv-BN-ReLU stem of 64 channels (no max-pool),
    four stages of two basic blocks with 64, 128, 256, 512 channels at width 1 (stages 2-4 start
    with stride 2: 32x32 ends at 4x4), global average pooling, one linear layer."""
    _input_rank(data, "resnet18", 3, "image (channels, height, width)")
    c_in, h, w = data.input_shape
    c = _channels(64, cfg.width)
    layers: list[nn.Module] = [nn.Conv2d(c_in, c, 3, 1, padding=1, bias=False),
                               nn.BatchNorm2d(c), nn.ReLU()]
    c_in = c
    for s, base in enumerate((64, 128, 256, 512)):
        c_out = _channels(base, cfg.width)
        down = s > 0 and (h + 1) // 2 >= 2 and (w + 1) // 2 >= 2  # 3x3 conv, stride 2, pad 1
        if down:
            h, w = (h + 1) // 2, (w + 1) // 2
        stride = 2 if down else 1
        layers += [BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)]
        c_in = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, data.num_classes)]
    return _he_init(nn.Sequential(*layers))


CNN1D_CHANNELS = (32, 64, 128)


@MODELS.register("cnn1d_bn", "1-D CNN with BatchNorm for sensor windows (channels, length): "
                 "3 conv-BN-ReLU-pool blocks, global average pooling (53k params, HAR)")
def cnn1d_bn(data: DataSpec, cfg: ModelConfig) -> nn.Module:
    """Three blocks of conv1d (kernel 5) - BN - ReLU - max-pool 2 with 32, 64, 128 channels at
    width 1 (a 128-sample window ends at 16), global average pooling over time, one linear
    layer. Small enough to train at width 1 on a CPU."""
    _input_rank(data, "cnn1d_bn", 2, "sensor-window (channels, length)")
    c_in, length = data.input_shape
    layers: list[nn.Module] = []
    for base in CNN1D_CHANNELS:
        c_out = _channels(base, cfg.width)
        layers += [nn.Conv1d(c_in, c_out, 5, padding=2, bias=False), nn.BatchNorm1d(c_out),
                   nn.ReLU()]
        if length // 2 >= 2:
            layers.append(nn.MaxPool1d(2))
            length //= 2
        c_in = c_out
    layers += [nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(c_in, data.num_classes)]
    return _he_init(nn.Sequential(*layers))


def build_model(cfg: ModelConfig, data: DataSpec) -> nn.Module:
    builder = MODELS.get(cfg.name)
    if cfg.dual_encoder:
        return dual_encoder(lambda: builder(data, cfg), cfg.name)
    return builder(data, cfg)
