"""Reading run and compare directories for the report, tolerant of partial or older runs.

The report must work on a run that is still going (no summary.json yet, a half-written last
line in metrics.jsonl) and on runs written before a metrics field existed, so every field is
optional here and the plots decide what they can draw.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedflock.errors import FedflockError

RUN_MARKERS = ("summary.json", "metrics.jsonl")
SEED_DIR = re.compile(r"^seed(-?\d+)$")


@dataclass
class SplitMatrix:
    """The similarity matrix behind decision `decision` (its index in the summary's `splits`),
    rows in the order of `members` (client ids)."""

    members: list[int]
    similarity: np.ndarray
    decision: int = 0


@dataclass
class RunData:
    """Everything the report reads from one run directory."""

    path: Path
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    matrices: list[SplitMatrix] = field(default_factory=list)

    @property
    def algorithm(self) -> str:
        algo = self.config.get("algorithm") or {}
        return str(self.summary.get("algorithm") or algo.get("name") or self.path.name)

    @property
    def seed(self) -> int | None:
        seed = self.summary.get("seed", self.config.get("seed"))
        return int(seed) if seed is not None else None

    @property
    def splits(self) -> list[dict[str, Any]]:
        return list(self.summary.get("splits") or [])

    @property
    def split_rounds(self) -> list[int]:
        """Rounds of the recorded decisions (each split a cluster)."""
        return [int(s["round"]) for s in self.splits if "round" in s]

    @property
    def true_groups(self) -> list[int] | None:
        groups = self.summary.get("true_groups")
        return [int(g) for g in groups] if groups else None

    @property
    def reference_groups(self) -> list[str] | None:
        """What a good partition keeps together, per client: the true group, and under an
        attack also whether the client is malicious (evaluation only)."""
        truth = self.true_groups
        if not truth:
            return None
        bad = set((self.summary.get("attack") or {}).get("malicious") or [])
        if not bad:
            return [f"true group {g}" for g in truth]
        single = len(set(truth)) == 1
        return [("" if single else f"true group {g}, ") + ("malicious" if c in bad else "benign")
                for c, g in enumerate(truth)]

    @property
    def tree(self) -> list[dict[str, Any]]:
        return list(self.summary.get("tree") or [])

    def has_norms(self) -> bool:
        return any("mean_norm" in c for rec in self.metrics for c in rec.get("clusters") or [])

    def setting(self) -> str:
        """`digits / label_swap`, or '' when the run recorded neither."""
        data = self.config.get("data") or {}
        dataset = self.summary.get("dataset") or data.get("dataset")
        scenario = self.summary.get("scenario") or (data.get("scenario") or {}).get("kind")
        return " / ".join(str(x) for x in (dataset, scenario) if x)

    def title(self) -> str:
        """`cfl on digits / label_swap (seed 0)`, from whatever the run recorded."""
        text = self.algorithm
        if self.setting():
            text += f" on {self.setting()}"
        if self.seed is not None:
            text += f" (seed {self.seed})"
        return text


def is_run_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in RUN_MARKERS)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise FedflockError(f"{path}: not valid JSON (line {err.lineno})") from None
    except OSError as err:
        raise FedflockError(f"{path}: cannot read ({err.strerror})") from None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """One record per round; a truncated last line (a run still writing) is ignored."""
    if not path.is_file():
        return []
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise FedflockError(f"{path}: line {i + 1} is not valid JSON") from None
        if isinstance(record, dict) and "round" in record:
            records.append(record)
    return records


def _read_matrices(folder: Path) -> list[SplitMatrix]:
    out = []
    files = [(int(m.group(1)), f) for f in folder.glob("split_*.npz")
             if (m := re.fullmatch(r"split_(\d+)\.npz", f.name))]
    for index, file in sorted(files):
        try:
            with np.load(file) as npz:
                out.append(SplitMatrix([int(m) for m in npz["members"]],
                                       np.asarray(npz["similarity"], dtype=float), index))
        except (OSError, KeyError, ValueError) as err:
            raise FedflockError(f"{file}: not a split file ({err})") from None
    return out


def load_run(path: Path) -> RunData:
    """Read one run directory (summary.json and/or metrics.jsonl must exist)."""
    if not is_run_dir(path):
        raise FedflockError(f"{path}: not a run directory (no summary.json or metrics.jsonl)")
    summary = _read_json(path / "summary.json") if (path / "summary.json").is_file() else {}
    config: dict[str, Any] = {}
    if (path / "config.yaml").is_file():
        try:
            config = yaml.safe_load((path / "config.yaml").read_text()) or {}
        except yaml.YAMLError:
            config = {}
    return RunData(path=path, summary=summary if isinstance(summary, dict) else {},
                   metrics=read_metrics(path / "metrics.jsonl"),
                   config=config if isinstance(config, dict) else {},
                   matrices=_read_matrices(path / "splits"))


@dataclass
class CompareData:
    """A compare directory: per algorithm (in table order) its runs, one per seed."""

    path: Path
    table_md: str
    seeds: list[int]
    runs: dict[str, list[RunData]]


def is_compare_dir(path: Path) -> bool:
    return (path / "compare.json").is_file() or bool(_seed_dirs(path))


def _seed_dirs(path: Path) -> dict[str, list[tuple[int, Path]]]:
    found: dict[str, list[tuple[int, Path]]] = {}
    for algo in sorted(p for p in path.iterdir() if p.is_dir()):
        for sub in algo.iterdir():
            match = SEED_DIR.match(sub.name)
            if match and sub.is_dir() and is_run_dir(sub):
                found.setdefault(algo.name, []).append((int(match.group(1)), sub))
    return {k: sorted(v) for k, v in found.items()}


def load_compare(path: Path) -> CompareData:
    """Read compare.json/compare.md (if written yet) and every <algorithm>/seed<k> run."""
    meta = _read_json(path / "compare.json") if (path / "compare.json").is_file() else {}
    meta = meta if isinstance(meta, dict) else {}
    dirs = _seed_dirs(path)
    order = [r.get("algorithm") for r in meta.get("rows", []) if isinstance(r, dict)]
    order = [a for a in order if a in dirs] + [a for a in dirs if a not in order]
    if not order:
        raise FedflockError(f"{path}: compare directory without any <algorithm>/seed<k> run")
    runs = {algo: [load_run(p) for _, p in dirs[algo]] for algo in order}
    seeds = [int(s) for s in meta.get("seeds", [])] or sorted(
        {seed for algo in order for seed, _ in dirs[algo]})
    md = path / "compare.md"
    return CompareData(path=path, table_md=md.read_text() if md.is_file() else "",
                       seeds=seeds, runs=runs)


def finite(value: Any) -> float | None:
    """A plottable float, or None for missing, non-numeric, infinite or NaN values."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None
