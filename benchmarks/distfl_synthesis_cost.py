"""What a DistFL clustering round costs the server: seconds to synthesise the inputs (against
their number z and the share E of BN channels matched) and to run every client's model on them,
per model.

The target model's BatchNorm statistics come from real data (a few training batches of the
dataset pushed through the model in train mode), so the synthesis matches statistics of the kind
a trained model holds; its cost does not depend on the weights' values, only on the model's size
and z. The responses are those of `clients` copies of the model (the cost of running n uploads).

    python -m benchmarks.distfl_synthesis_cost
    python -m benchmarks.distfl_synthesis_cost --models cnn_bn:mnist,vgg11_bn:cifar10 --steps 200

`--rows FILE` also writes each line as JSON (the `distfl-synthesis-cost` table of
`benchmarks/reproduce.py` is rendered from them).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.tables import append_row, machine_facts
from fedflock.config import DataConfig, ModelConfig
from fedflock.data import build_federated_data
from fedflock.models import ModelHandle
from fedflock.models.zoo import build_model
from fedflock.similarity.knowledge import responses_of, synthesize_inputs

DEFAULT_MODELS = "cnn_bn:mnist,vgg11_bn:cifar10,resnet18:cifar10"


def _handle(name: str, dataset: str, width: float) -> tuple[ModelHandle, torch.Tensor]:
    """A handle on the model and a target vector whose BN statistics come from real data."""
    data = build_federated_data(DataConfig(dataset=dataset, clients=1, samples_per_client=256,
                                           test_per_client=1), seed=0)
    cfg = ModelConfig(name=name, width=width)
    handle = ModelHandle(lambda: build_model(cfg, data.spec), input_shape=data.input_shape)
    model = handle.module()
    model.train()
    with torch.no_grad():
        for batch in data.clients[0].x_train.split(64):
            model(batch)
    return handle, handle.vector(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help="name:dataset,...")
    parser.add_argument("--width", type=float, default=0.25, help="width multiplier (models "
                        "that take one)")
    parser.add_argument("--z", default="50,200,800")
    parser.add_argument("--importance", default="0.25,0.5,1.0")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rows", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    machine = machine_facts()
    print(f"synthesis: {args.steps} Adam steps; responses: {args.clients} client models; "
          f"torch threads {torch.get_num_threads()}")
    print("| model | dataset | parameters | z | E | synthesis s | loss drop | responses s |")
    print("|---|---|---|---|---|---|---|---|")
    for item in args.models.split(","):
        name, dataset = item.split(":")
        handle, target = _handle(name, dataset, args.width)
        shape = handle.input_shape
        assert shape is not None
        params = sum(b.stop - b.start for b in handle.blocks if b.trainable)
        for z in (int(v) for v in args.z.split(",")):
            for keep in (float(v) for v in args.importance.split(",")):
                t0 = time.perf_counter()
                synthesis = synthesize_inputs(handle.module(target), shape, z, args.steps,
                                              keep=keep, seed=0)
                t1 = time.perf_counter()
                responses_of(handle, (target for _ in range(args.clients)), synthesis.inputs)
                t2 = time.perf_counter()
                drop = synthesis.losses[0] / max(synthesis.losses[-1], 1e-12)
                print(f"| {name} | {dataset} | {params:,} | {z} | {keep:g} | {t1 - t0:.2f} | "
                      f"{drop:.0f}x | {t2 - t1:.2f} |", flush=True)
                if args.rows:
                    append_row(args.rows, {
                        "model": name, "dataset": dataset, "parameters": params, "z": z,
                        "importance": keep, "steps": args.steps, "clients": args.clients,
                        "synthesis_seconds": t1 - t0, "loss_drop": drop,
                        "responses_seconds": t2 - t1, "machine": machine})


if __name__ == "__main__":
    main()
