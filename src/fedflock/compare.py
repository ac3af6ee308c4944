"""Several algorithms x seeds on one config, side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedflock.config import ExperimentConfig
from fedflock.errors import ConfigError
from fedflock.experiment import check_run_directory, run_experiment
from fedflock.fileio import write_json, write_text
from fedflock.validation import validate

HEADER = ("algorithm", "accuracy %", "worst %", "clusters", "ARI", "rounds", "seconds",
          "up Mfloats")
ATTACK_HEADER = ("benign %", "ASR %")
DP_HEADER = "DP ε"


def _percent(row: dict[str, Any]) -> bool:
    return row.get("metric", "accuracy") == "accuracy"


def header(rows: list[dict[str, Any]]) -> list[str]:
    """The table's columns: the attack columns only when the runs faced an attack, the DP
    column only under differential privacy; the primary metric's name when it is not
    accuracy (e.g. perplexity)."""
    columns = list(HEADER)
    if rows and not _percent(rows[0]):
        columns[1:3] = [rows[0]["metric"], "worst"]
    columns += list(ATTACK_HEADER) if any("benign" in r for r in rows) else []
    return columns + ([DP_HEADER] if any("dp" in r for r in rows) else [])


def config_for(raw: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of the raw config running algorithm `name`: the config's own algorithm keeps its
    parameters, another runs with its defaults (one algorithm's parameters mean nothing to
    another)."""
    raw = json.loads(json.dumps(raw))
    params = raw["algorithm"] if raw["algorithm"]["name"] == name else {}
    raw["algorithm"] = {**params, "name": name}
    return raw


def compare(config: ExperimentConfig, algorithms: list[str], seeds: list[int], out: Path,
            quiet: bool = False, resume: bool = False) -> list[dict[str, Any]]:
    """Run every (algorithm, seed) into out/<algorithm>/seed<k>; return one row per algorithm.
    The config's algorithm keeps its parameters; the others run with their defaults (the
    parameters of one algorithm mean nothing to another).
    `resume`: runs already there continue from their checkpoints (finished ones are not
    re-run), the others start."""
    for what, given in (("algorithm", algorithms), ("seed", seeds)):
        if not given:
            raise ConfigError(f"compare: no {what} given")
        if len(set(given)) < len(given):
            raise ConfigError(f"compare: {what}s repeat ({', '.join(map(str, given))})")
    base = config.model_dump(mode="json")
    # Validate all before running any, so a typo fails in a second, not after an hour.
    configs = {}
    for name in algorithms:
        raw = config_for(base, name)
        for seed in seeds:
            configs[name, seed] = validate({**raw, "seed": seed})
    # ... and every run directory, so a clash is not met after hours of earlier runs
    resumed = {key: resume and (_run_dir(out, *key) / "config.yaml").is_file()
               for key in configs}
    for key, cfg in configs.items():
        check_run_directory(cfg, _run_dir(out, *key), resumed[key])
    rows = []
    for name in algorithms:
        summaries = [run_experiment(configs[name, s], _run_dir(out, name, s),
                                    resume=resumed[name, s], quiet=quiet) for s in seeds]
        rows.append(summarise(name, summaries))
    write_json(out / "compare.json", {"seeds": seeds, "rows": rows})
    write_text(out / "compare.md", markdown_table(rows, seeds))
    return rows


def _run_dir(out: Path, algorithm: str, seed: int) -> Path:
    return out / algorithm / f"seed{seed}"


def summarise(name: str, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    def stat(values: list[float]) -> dict[str, float]:
        return {"mean": float(np.mean(values)), "std": float(np.std(values)),
                "per_seed": [float(v) for v in values]}

    metric = summaries[0].get("primary_metric", "accuracy")
    row = {
        "algorithm": name,
        "metric": metric,
        "accuracy": stat([s[metric]["mean"] for s in summaries]),
        "worst": stat([s[metric]["worst"] for s in summaries]),
        "clusters": stat([s["num_clusters"] for s in summaries]),
        "ari": stat([s["ari"] for s in summaries]),
        "rounds": summaries[0]["rounds"],
        "seconds": stat([s["wall_seconds"] for s in summaries]),
        "up_floats": stat([s["communication"]["up_floats"] / 1e6 for s in summaries]),
    }
    attacks = [s.get("attack") for s in summaries]
    if all(a and a.get(f"benign_{metric}") is not None for a in attacks):
        row["benign"] = stat([a[f"benign_{metric}"] for a in attacks])
        if all(a.get("attack_success_rate") is not None for a in attacks):
            row["asr"] = stat([a["attack_success_rate"] for a in attacks])
    dps = [s.get("dp") for s in summaries]
    if all(dps):
        first = dps[0]
        row["dp"] = {"epsilon": stat([d["epsilon"] for d in dps]), "delta": first["delta"],
                     "mechanism": first["mechanism"],
                     "noise_multiplier": first["noise_multiplier"], "clip": first["clip"]}
    return row


def _fmt(stat: dict[str, float], pct: bool = False, digits: int = 2) -> str:
    scale, digits = (100.0, 1) if pct else (1.0, digits)
    mean = f"{stat['mean'] * scale:.{digits}f}"
    if len(stat["per_seed"]) == 1:
        return mean
    return f"{mean} ± {stat['std'] * scale:.{digits}f}"


def format_row(row: dict[str, Any]) -> list[str]:
    return [
        row["algorithm"],
        _fmt(row["accuracy"], pct=_percent(row)),
        _fmt(row["worst"], pct=_percent(row)),
        _fmt(row["clusters"], digits=1),
        _fmt(row["ari"], digits=2),
        str(row["rounds"]),
        _fmt(row["seconds"], digits=1),
        _fmt(row["up_floats"], digits=1),
        *_attack_cells(row),
        *_dp_cells(row),
    ]


def _attack_cells(row: dict[str, Any]) -> list[str]:
    """Benign accuracy and attack success rate, when the runs faced an attack."""
    if "benign" not in row:
        return []
    return [_fmt(row["benign"], pct=True), _fmt(row["asr"], pct=True) if "asr" in row else "–"]


def _dp_cells(row: dict[str, Any]) -> list[str]:
    """The run's ε (whole run, max over clients), when it ran under differential privacy."""
    if "dp" not in row:
        return []
    return [_fmt(row["dp"]["epsilon"], digits=2)]


def _dp_note(rows: list[dict[str, Any]]) -> list[str]:
    """What the ε column means, below the table."""
    notes = sorted({f"{r['dp']['mechanism']} (σ = {r['dp']['noise_multiplier']:.4g}, "
                    f"C = {r['dp']['clip']:g}, δ = {r['dp']['delta']:g})"
                    for r in rows if "dp" in r})
    if not notes:
        return []
    return ["", f"{DP_HEADER}: (ε, δ)-DP of the whole run against the server, the maximum over "
            f"clients (RDP accountant, Opacus); mechanism {'; '.join(notes)}."]


def markdown_table(rows: list[dict[str, Any]], seeds: list[int]) -> str:
    columns = header(rows)
    lines = [f"Seeds: {', '.join(map(str, seeds))} (mean ± std over seeds, final round)", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(format_row(r)) + " |" for r in rows]
    lines += _dp_note(rows)
    return "\n".join(lines) + "\n"
