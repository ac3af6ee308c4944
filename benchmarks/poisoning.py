"""Clustering as a defence against model poisoning, against the robust aggregation rules.

For each attack fraction, every algorithm runs `configs/mnist_attack_sign_flip.yaml` (or the
config given) with that share of malicious clients, over several seeds; the table gives the
final-round accuracy of the BENIGN clients on their own models (and the attack success rate for
label-flipping attacks), beside the attack-free run of each algorithm.

    python benchmarks/poisoning.py --fractions 0.2,0.4,0.6 --seeds 0,1,2
    python benchmarks/poisoning.py --set attack.colluding=false
    python benchmarks/poisoning.py --config configs/mnist_attack_label_flip.yaml
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np

from fedflock.compare import compare
from fedflock.validation import load_config

ALGORITHMS = "incremental,fedavg,median,trimmed_mean,krum,multi_krum"


def _cell(values: list[float]) -> str:
    return f"{100 * np.mean(values):.1f} ± {100 * np.std(values):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/mnist_attack_sign_flip.yaml"))
    parser.add_argument("--algorithms", default=ALGORITHMS)
    parser.add_argument("--fractions", default="0.2,0.4,0.6")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", type=Path, default=Path("runs/poisoning"))
    parser.add_argument("--no-clean", action="store_true", help="skip the attack-free runs")
    args = parser.parse_args()
    algorithms = args.algorithms.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    fractions = [float(f) for f in args.fractions.split(",")]

    settings = [] if args.no_clean else [("none", ["attack=null"])]
    settings += [(f"{f:.0%}", [f"attack.fraction={f}"]) for f in fractions]
    results: dict[str, dict[str, dict]] = {}
    for label, extra in settings:
        config = load_config(args.config, args.overrides + extra)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows = compare(config, algorithms, seeds, args.out / label.rstrip("%"), quiet=True)
        results[label] = {r["algorithm"]: r for r in rows}

    base = load_config(args.config, args.overrides)
    attack = base.attack
    print(f"\n{args.config} {' '.join(args.overrides)}: attack {attack.kind if attack else '-'}"
          f" (colluding {attack.colluding if attack else '-'}), seeds {args.seeds}, "
          f"{base.rounds} rounds; benign clients' accuracy % (final round)")
    header = ["algorithm"] + [f"malicious {label}" for label, _ in settings]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name in algorithms:
        cells = []
        for label, _ in settings:
            row = results[label][name]
            cells.append(_cell(row["benign"]["per_seed"] if "benign" in row
                               else row["accuracy"]["per_seed"]))
        print(f"| {name} | " + " | ".join(cells) + " |")
    if any("asr" in r for res in results.values() for r in res.values()):
        print("\nattack success rate % (targeted test samples classified as the attacker's "
              "target)")
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for name in algorithms:
            cells = [_cell(results[label][name]["asr"]["per_seed"])
                     if "asr" in results[label][name] else "–" for label, _ in settings]
            print(f"| {name} | " + " | ".join(cells) + " |")
    (args.out / "poisoning.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
