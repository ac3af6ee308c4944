"""What one Flower message costs a node: each message is a fresh ClientApp process (Flower >= 1.21),
so import, config, data and model are paid again by every message.

For each config, fresh Python processes (as a SuperNode's SuperExec starts them) time, in order:
`import torch, flwr` (the floor no message goes below), the import of the ClientApp module, the
config load and validation, the node's data, the client runtime (model), one training task
(`Train`, through the real codec and handler), and the whole message end to end (import the
module, then the handler on a real Message). The node's partition cache is warmed first; the
first message of a node, which draws the scenario, is reported apart.

    python benchmarks/deployment_message.py                # the three configs below
    PYTHONPATH=/path/to/old/src python benchmarks/deployment_message.py   # another tree: before
    python benchmarks/deployment_message.py --deployment "CIFAR-10, 20 clients" --rounds 3
    python benchmarks/deployment_message.py --deployment "digits, 4 clients" --rounds 12 --tls

`--deployment` runs the config on a real loopback deployment instead (a SuperLink and one
SuperNode per client, `LocalDeployment`) and prints the seconds of each round from the run's
metrics (round 1 includes each node's first message, which fills its cache).

Runs against the `fedflock` on PYTHONPATH (or installed), so the same script measures a tree from
before a change; a tree without the partition cache draws the whole federation per message.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIGS = {
    "digits, 4 clients": "configs/flower_demo.yaml",
    "MNIST, 100 clients": "configs/mnist_partial_label_permutation.yaml",
    "CIFAR-10, 20 clients": "configs/cifar10_label_permutation.yaml",
}

# One message in a fresh process. Prints a JSON object of seconds per phase.
CHILD = r'''
import json, sys, time
t0 = time.perf_counter()
import torch, flwr.app, flwr.clientapp
t1 = time.perf_counter()
import fedflock.engines.flower.clientapp as ca
try:  # the work, apart from the ClientApp (a tree from before the split has it in clientapp)
    import fedflock.engines.flower.handler as work
except ImportError:
    work = ca
from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
t2 = time.perf_counter()
config_path, partition, cache, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
context = Context(run_id=1, node_id=7, node_config={"partition-id": partition, "cache-dir": cache},
                  state=RecordDict(), run_config={"config": config_path})
TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 7
from fedflock.client.tasks import Train
from fedflock.engines.flower import codec
single = not hasattr(codec, "tasks_from_message")  # a tree from before bundled messages

def message(params):
    task = Train(partition, 1, params)
    if single:
        return Message(codec.task_content(task), 7, codec.message_type(task))
    return Message(codec.task_content([task]), 7, codec.message_type([task]))

if mode == "total":  # what a SuperNode's process does: import, then the handler
    params = torch.load(sys.argv[5], weights_only=True)
    t3 = time.perf_counter()
    ca.app(message(params), context)
    t4 = time.perf_counter()
    print(json.dumps({"total": (t2 - t0) + (t4 - t3)}))
    sys.exit()
from fedflock.engines.flower.settings import experiment_config
from fedflock.client.runtime import ClientRuntime
cfg = experiment_config(context.run_config)
t3 = time.perf_counter()
if hasattr(work, "_node_data"):
    data = work._node_data(context, cfg, partition)
else:
    from fedflock.data.scenarios import build_federated_data
    data = build_federated_data(cfg.data, cfg.seed)
t4 = time.perf_counter()
runtime = ClientRuntime(data, cfg.model, cfg.training, cfg.seed, cfg.privacy, cfg.attack)
t5 = time.perf_counter()
params = runtime.initial_params()
if len(sys.argv) > 5:
    torch.save(params, sys.argv[5])
m = message(params)
t6 = time.perf_counter()
runtime.run(codec.tasks_from_message(m, partition) if not single
            else [codec.task_from_message(m, partition)])
t7 = time.perf_counter()
print(json.dumps({"floor": t1 - t0, "import": t2 - t1, "config": t3 - t2, "data": t4 - t3,
                  "model": t5 - t4, "task": t7 - t6}))
'''


def child(args: list[str], env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True,
                          env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the message process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(config: Path, repeats: int, env: dict[str, str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="fedflock-msg-") as tmp:
        cache, params = str(Path(tmp) / "cache"), str(Path(tmp) / "params.pt")
        first = child([str(config), "0", cache, "phases", params], env)  # draws, fills cache
        runs = [child([str(config), "0", cache, "phases"], env) for _ in range(repeats)]
        totals = [child([str(config), "0", cache, "total", params], env)["total"]
                  for _ in range(repeats)]
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    out["total"] = statistics.median(totals)
    out["first data"] = first["data"]
    return out


def deployment_rounds(name: str, rounds: int, env: dict[str, str], tls: bool = False) -> None:
    import time

    import yaml

    from fedflock.engines.flower.local import LocalDeployment

    config = Path(CONFIGS[name]).resolve()
    with tempfile.TemporaryDirectory(prefix="fedflock-dep-") as tmp:
        clients = int(yaml.safe_load(config.read_text())["data"]["clients"])
        out = Path(tmp) / "run"
        overrides = f'set="rounds={rounds};checkpoint_every={rounds}"'
        cache = {i: f'cache-dir="{tmp}/cache"' for i in range(clients)}  # cold, as a new node
        secure = {}
        if tls:  # TLS under a fresh CA, only registered SuperNodes admitted
            from fedflock.engines.flower.credentials import write_credentials

            secure = {"credentials": write_credentials(Path(tmp) / "credentials", clients),
                      "authenticate": True}
        start = time.perf_counter()
        with LocalDeployment(clients, Path(tmp) / "deployment", node_config=cache,
                             **secure) as deployment:
            submitted = deployment.submit(config, out, f"round-timeout=600.0 {overrides}")
            if submitted.returncode != 0:
                raise SystemExit(submitted.stdout + submitted.stderr)
            while not (out / "summary.json").is_file():
                if (out / "error.txt").is_file():
                    raise SystemExit((out / "error.txt").read_text())
                time.sleep(1.0)
        wall = time.perf_counter() - start
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        summary = json.loads((out / "summary.json").read_text())
    seconds = [sum(r["timing"].values()) for r in records]
    print(f"{name} on {clients} SuperNodes{' (TLS, node authentication)' if tls else ''}, "
          f"{rounds} rounds: " +
          ", ".join(f"round {i + 1} {s:.1f} s" for i, s in enumerate(seconds)) +
          f"; whole run (start-up, handshake, final evaluation) {wall:.1f} s; accuracy "
          f"{summary['accuracy']['mean']:.4f}, ARI {summary.get('ari')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per figure "
                        "(the median is shown)")
    parser.add_argument("--only", default=None, help="one of: " + "; ".join(CONFIGS))
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--deployment", default=None, help="time rounds of this config on a "
                        "loopback deployment instead")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tls", action="store_true", help="--deployment over TLS with node "
                        "authentication (fedflock deploy init's credentials)")
    args = parser.parse_args()
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    if args.deployment:
        deployment_rounds(args.deployment, args.rounds, env, args.tls)
        return
    import fedflock

    print(f"fedflock from {Path(fedflock.__file__).parent}; median of {args.repeats} fresh "
          "processes, seconds")
    cols = ["floor", "import", "config", "data", "model", "task", "total", "first data"]
    # what fedflock adds to a message beyond the floor and the task, timed in one process (the
    # end-to-end total comes from other processes, so total - floor - task is noisier)
    print("| per message | " + " | ".join(cols) + " | beyond floor and task |")
    print("|---" * (len(cols) + 2) + "|")
    results = {}
    for name, config in CONFIGS.items():
        if args.only and args.only != name:
            continue
        row = measure(Path(config).resolve(), args.repeats, env)
        results[name] = row
        overhead = row["import"] + row["config"] + row["data"] + row["model"]
        print(f"| {name} | " + " | ".join(f"{row[c]:.2f}" for c in cols) +
              f" | {overhead:.2f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
