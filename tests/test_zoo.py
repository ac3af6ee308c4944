"""The BatchNorm models for DistFL (vgg11_bn, resnet18, cnn1d_bn): the papers' sizes at width 1,
every input size they accept, BN buffers through the flat vector, the executor choice, and a
short DistFL run with each (its synthesis runs on their BN layers)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from fedflock.api import run
from fedflock.client.executors import EXECUTORS, choose_executor
from fedflock.client.runtime import ClientRuntime
from fedflock.client.tasks import Train
from fedflock.config import ModelConfig
from fedflock.data.scenarios import build_federated_data
from fedflock.data.spec import DataSpec
from fedflock.errors import ConfigError
from fedflock.models import ModelHandle, build_model
from fedflock.similarity.knowledge import batch_norm_layers, synthesize_inputs
from fedflock.validation import validate
from tests.conftest import small_config

CIFAR, MNIST, DIGITS, HAR = (3, 32, 32), (1, 28, 28), (1, 8, 8), (6, 128)
IMAGE_MODELS = ("vgg11_bn", "resnet18")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """These tiny models run faster on one intra-op thread, and far faster when other
    processes share the cores (threads then wait on each other)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model(name: str, shape: tuple[int, ...], width: float = 0.25, classes: int = 10
           ) -> nn.Module:
    return build_model(ModelConfig(name=name, width=width), DataSpec(shape, classes))


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("name", "shape", "classes", "params", "bn"), [
    # VGG-11 "A" convolutions (9.22M) + BN + a 512x10 head; the classic CIFAR ResNet-18 count.
    ("vgg11_bn", CIFAR, 10, 9_228_362, 8),
    ("resnet18", CIFAR, 10, 11_173_962, 20),  # stem + 16 in blocks + 3 projection shortcuts
    ("cnn1d_bn", HAR, 6, 53_382, 3),
])
def test_width_one_is_the_papers_model(name: str, shape: tuple[int, ...], classes: int,
                                       params: int, bn: int) -> None:
    model = _model(name, shape, 1.0, classes)
    assert _params(model) == params
    assert len(batch_norm_layers(model)) == bn
    first = next(m for m in model.modules() if isinstance(m, nn.Conv1d | nn.Conv2d))
    assert first.out_channels == (32 if name == "cnn1d_bn" else 64)


def test_width_scales_channels_and_is_checked() -> None:
    quarter = _model("vgg11_bn", CIFAR, 0.25)
    widths = [m.num_features for m in batch_norm_layers(quarter)]
    assert widths == [16, 32, 64, 64, 128, 128, 128, 128]
    assert [m.num_features for m in batch_norm_layers(_model("cnn1d_bn", HAR, 0.01, 6))] == [1] * 3
    for bad in (0, -1, 5):
        with pytest.raises(ValidationError):
            ModelConfig(name="resnet18", width=bad)


@pytest.mark.parametrize(("name", "shape", "pools"), [
    ("vgg11_bn", CIFAR, 5), ("vgg11_bn", MNIST, 4), ("vgg11_bn", DIGITS, 3),
    ("resnet18", CIFAR, 3), ("resnet18", MNIST, 3), ("resnet18", DIGITS, 2),
    ("cnn1d_bn", HAR, 3), ("cnn1d_bn", (3, 5), 1),
])
def test_every_bn_layer_sees_two_positions_so_one_sample_trains(
        name: str, shape: tuple[int, ...], pools: int) -> None:
    """Downsampling stops before a map would shrink below 2 per side with BN after it (and VGG's
    last pool only closes a 2x2 map): a trailing batch of one sample still trains."""
    model = _model(name, shape).train()
    seen: list[int] = []
    for layer in batch_norm_layers(model):
        layer.register_forward_hook(lambda m, a, o: seen.append(a[0][0, 0].numel()))
    downs = [m for m in model.modules() if isinstance(m, nn.MaxPool1d | nn.MaxPool2d)
             or (isinstance(m, nn.Conv2d) and m.stride == (2, 2) and m.kernel_size == (3, 3))]
    assert len(downs) == pools
    out = model(torch.randn(1, *shape))  # BN in training mode refuses one value per channel
    assert out.shape == (1, 10) and min(seen) >= 2


@pytest.mark.parametrize(("name", "shape"), [("vgg11_bn", HAR), ("resnet18", (1, 784)),
                                             ("cnn1d_bn", MNIST)])
def test_wrong_input_rank_is_one_config_line(name: str, shape: tuple[int, ...]) -> None:
    pattern = rf"model.name: '{name}' needs .* {re.escape(str(shape))}$"
    with pytest.raises(ConfigError, match=pattern) as err:
        _model(name, shape)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["vgg11_bn", "resnet18", "cnn1d_bn"])
def test_bn_buffers_travel_in_the_flat_vector(name: str) -> None:
    shape = HAR if name == "cnn1d_bn" else DIGITS
    handle = ModelHandle(lambda: _model(name, shape), input_shape=shape)
    spec, model = handle.spec, handle.module()
    bn = batch_norm_layers(model)
    assert spec.size - spec.num_trainable == 2 * sum(m.num_features for m in bn)
    assert not any(n.endswith("num_batches_tracked") for n in spec.names)
    model.train()
    model(torch.randn(4, *shape))  # moves the running statistics
    vector = handle.vector(model)
    again = handle.module(vector)
    assert torch.equal(handle.vector(again), vector)
    for a, b in zip(batch_norm_layers(again), bn, strict=True):
        assert torch.equal(a.running_mean, b.running_mean) and torch.equal(a.running_var,
                                                                           b.running_var)


def _runtime(name: str) -> ClientRuntime:
    cfg = validate(small_config(**{"model": {"name": name, "width": 0.25},
                                   "data.clients": 4, "data.samples_per_client": 20}))
    return ClientRuntime(build_federated_data(cfg.data, 0), cfg.model, cfg.training, 0)


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_training_moves_buffers_and_batched_is_never_chosen(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = _runtime(name)
    start = runtime.initial_params()
    update = Train(0, 1, start).run(runtime).update
    assert update[runtime.spec.num_trainable:].abs().sum() > 0  # running stats are federated
    with pytest.raises(ConfigError, match="batched"):
        EXECUTORS.get("batched")(runtime)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with choose_executor(runtime, "auto", 1) as executor:  # even on a GPU
        assert executor.name == "sequential"


def _distfl_run(tmp_path: Path, name: str, **data: object) -> dict:
    raw = small_config(**{
        "rounds": 2, "data.clients": 4, "data.samples_per_client": 24, "data.test_per_client": 8,
        "data.scenario": {"kind": "iid"}, "model": {"name": name, "width": 0.125},
        "training.batch_size": 16, "checkpoint_every": 2,
        "algorithm": {"name": "distfl", "warmup_rounds": 1, "synthetic": 8, "steps": 3},
        **data})
    return run(raw, tmp_path / name).summary


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_a_short_distfl_run(tmp_path: Path, name: str) -> None:
    summary = _distfl_run(tmp_path, name)
    assert [d["round"] for d in summary["splits"]] == [1]  # the clustering round synthesised
    assert sorted(c for part in summary["clusters"] for c in part) == [0, 1, 2, 3]
    assert 0 <= summary["accuracy"]["mean"] <= 1


def test_a_short_distfl_run_on_har_users(tmp_path: Path, shared_data: Path) -> None:
    summary = _distfl_run(tmp_path, "cnn1d_bn", **{
        "data": {"dataset": "har", "root": str(shared_data), "clients": 4,
                 "samples_per_client": 64, "test_per_client": 32,
                 "scenario": {"kind": "natural"}}})
    assert summary["dataset"] == "har" and summary["num_clients"] == 4
    assert [d["round"] for d in summary["splits"]] == [1]


@pytest.mark.parametrize(("name", "shape"), [("vgg11_bn", DIGITS), ("resnet18", DIGITS),
                                             ("cnn1d_bn", HAR)])
def test_synthesis_moves_inputs_through_their_bn_layers(name: str, shape: tuple[int, ...]
                                                        ) -> None:
    """The BN-matching loss reaches the inputs through each model (cnn_bn's 10x fall is in
    test_distfl; deep nets fall more slowly, see the DistFL synthesis benchmark)."""
    torch.manual_seed(0)
    model = _model(name, shape).train()
    with torch.no_grad():
        for _ in range(3):  # running statistics of some data other than noise
            model(torch.rand(16, *shape) * 3 + 1)
    result = synthesize_inputs(model, shape, count=8, steps=5, lr=0.3, seed=0)
    assert result.inputs.shape == (8, *shape)
    assert result.losses[-1] < 0.95 * result.losses[0]
