"""The run directory: config.yaml, metrics.jsonl, summary.json, checkpoints/, splits/.

Everything written here is written atomically and synced (`fedflock.fileio`), so a run killed at
any moment leaves the last complete checkpoint and summary behind; a torn last line of
metrics.jsonl (a kill or a full disk in the middle of an append) is dropped on resume. A lock
file keeps two runs from writing one directory. Checkpoints hold tensors and plain Python values
only and are loaded with `weights_only=True`: a checkpoint from someone else cannot run code.
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
import yaml

from fedflock.errors import FedflockError
from fedflock.fileio import atomic_open, json_text, write_json, write_text
from fedflock.validation import resolved, validate

CHECKPOINT_FORMAT = 3  # 1: pickled numpy arrays; 2: algorithm states loaded with defaults


def storable(value: Any) -> Any:
    """`value` as tensors and plain Python values (what `torch.load(weights_only=True)`
    admits): numpy arrays become tensors, numpy scalars Python numbers."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.array(value))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    if isinstance(value, tuple):
        return tuple(storable(v) for v in value)
    return value


def _unsafe_reason(err: Exception) -> str:
    found = re.search(r"(?:Unsupported global|GLOBAL) ([\w.]+)", str(err))
    what = f" ({found.group(1)})" if found else ""
    return f"it holds an object other than tensors and plain values{what}, refused unread"


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, dict):
        return {prefix: value}
    return {k: v for key, sub in value.items()
            for k, v in _flat(sub, f"{prefix}.{key}" if prefix else str(key)).items()}


def _config_difference(stored: str, config_text: str) -> str | None:
    """None when the stored config.yaml holds the settings of the given one (key order and
    formatting aside; one written before every parameter was spelled out is read with today's
    defaults, with a warning naming them); else the first setting that differs, for the
    refusal's line."""
    given = yaml.safe_load(config_text)
    try:
        raw = yaml.safe_load(stored)
        if raw == given:
            return None
        if not isinstance(raw, dict):
            raise TypeError("not a mapping")
        ours = _flat(resolved(validate(raw)).model_dump(mode="json"))
    except (FedflockError, yaml.YAMLError, TypeError):
        return "the stored config does not validate"
    theirs = _flat(resolved(validate(given)).model_dump(mode="json"))
    key = next((k for k in sorted(ours.keys() | theirs.keys()) if ours.get(k) != theirs.get(k)),
               None)
    if key is not None:
        return f"{key}: {ours.get(key)!r} there, {theirs.get(key)!r} here"
    missing = sorted(set(_flat(given)) - set(_flat(raw)))
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4
                                          else "")
        warnings.warn(f"config.yaml does not name {shown}: resuming with today's defaults for "
                      "them", stacklevel=3)
    return None


class RunDirectory:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock: IO[str] | None = None

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoints" / "last.pt"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def tokenizer_path(self) -> Path:
        return self.path / "tokenizer.json"

    def write_tokenizer(self, raw: str) -> None:
        """The run's tokenizer, so new clients' text is cut as its clients' was."""
        write_text(self.tokenizer_path, raw)

    def read_tokenizer(self) -> str | None:
        return self.tokenizer_path.read_text() if self.tokenizer_path.is_file() else None

    # -- one writer at a time ------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold `.lock` for the whole run: a second run on the same directory fails at once.
        The lock is the kernel's (flock), so a killed run never leaves it held."""
        self._check_folder()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fh = (self.path / ".lock").open("a+")
        except OSError as err:
            raise FedflockError(f"--out {self.path}: cannot write there ({err.strerror})"
                                ) from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            fh.close()
            raise FedflockError(f"run directory {self.path} is in use by another fedflock run "
                                f"(pid {holder}); wait for it or use another --out") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    def _check_folder(self) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise FedflockError(f"--out {self.path}: a file is there, expected a directory")

    # -- starting and resuming -----------------------------------------------------------------
    def refuse_overwriting(self, source: Path) -> None:
        """A run writes its resolved config to config.yaml: refuse when that is the very file
        being run (`fedflock run folder/config.yaml --out folder`), which it would replace."""
        if self.config_path.exists() and self.config_path.samefile(source):
            raise FedflockError(f"--out {self.path}: its config.yaml is the config being run, "
                                "which the run would overwrite; use another --out")

    def check_start(self, config_text: str, resume: bool) -> bool:
        """Whether a run of `config_text` may start here (raises the refusal's one line if
        not); True when it would continue from the checkpoint. Writes nothing, so a caller
        can check every directory before the first run starts (`compare`, a Flower engine
        that takes seconds to start).

        A new run refuses a directory holding a finished run or a checkpoint; a run that was
        killed before its first checkpoint starts afresh (with a warning), as does `--resume`
        of such a run."""
        self._check_folder()
        has_checkpoint = self.checkpoint_path.is_file()
        if resume:
            if not self.config_path.is_file():
                raise FedflockError(f"--resume: {self.path} holds no run (no config.yaml)")
            difference = _config_difference(self.config_path.read_text(errors="replace"),
                                            config_text)
            if difference is not None:
                raise FedflockError(f"--resume: config differs from {self.config_path} "
                                    f"({difference}); resume with the same config and --set "
                                    "options")
            if has_checkpoint:
                return True
            warnings.warn(f"--resume: {self.path} has no checkpoint yet; starting from round 1",
                          stacklevel=2)
        elif has_checkpoint or (self.path / "summary.json").exists():
            raise FedflockError(
                f"run directory {self.path} already holds a run; use --resume or another --out")
        elif self.metrics_path.exists():
            warnings.warn(f"{self.path} holds an unfinished run without a checkpoint; starting "
                          "it afresh", stacklevel=2)
        return False

    def prepare(self, config_text: str, resume: bool) -> bool:
        """Make the directory ready (`check_start`); True when the run continues from its
        checkpoint."""
        if self.check_start(config_text, resume):
            return True
        (self.path / "checkpoints").mkdir(parents=True, exist_ok=True)
        self.metrics_path.unlink(missing_ok=True)
        write_text(self.config_path, config_text)
        return False

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, state: dict[str, Any]) -> None:
        with atomic_open(self.checkpoint_path, "wb") as fh:
            torch.save(storable({"format": CHECKPOINT_FORMAT, **state}), fh)

    def load_checkpoint(self, algorithm: str | None = None) -> dict[str, Any]:
        """The last checkpoint to resume from (`read_checkpoint`); the metrics logged after it
        are dropped (they are re-run)."""
        state = self.read_checkpoint(algorithm)
        self.truncate_metrics(state["round"])
        return state

    def read_checkpoint(self, algorithm: str | None = None) -> dict[str, Any]:
        """The last checkpoint, read without running any code and checked to be a checkpoint of
        `algorithm`. Every problem is one line naming the file."""
        path = self.checkpoint_path
        try:
            state = torch.load(path, weights_only=True, map_location="cpu")
        except FileNotFoundError:
            raise FedflockError(f"{path}: no checkpoint") from None
        except Exception as err:  # empty, truncated, not a zip, or unsafe content
            reason = _unsafe_reason(err) if isinstance(err, pickle.UnpicklingError) else \
                f"empty, truncated or not a checkpoint ({type(err).__name__})"
            raise FedflockError(f"{path}: not a usable checkpoint: {reason}") from None
        problem = self._problem(state, algorithm)
        if problem:
            raise FedflockError(f"{path}: {problem}")
        return state

    @staticmethod
    def _problem(state: Any, algorithm: str | None) -> str | None:
        if not isinstance(state, dict) or not isinstance(state.get("algorithm"), dict):
            return "not a fedflock checkpoint"
        if state.get("format") != CHECKPOINT_FORMAT:
            return (f"checkpoint format {state.get('format', 1)!r}, this fedflock reads "
                    f"{CHECKPOINT_FORMAT}; start the run afresh")
        if not isinstance(state.get("round"), int) or state["round"] < 0:
            return f"round {state.get('round')!r} is not a round number"
        if algorithm is not None and state.get("algorithm_name") != algorithm:
            return (f"a checkpoint of algorithm {state.get('algorithm_name')!r}, the run's "
                    f"config says {algorithm!r}")
        return None

    # -- metrics -------------------------------------------------------------------------------
    def truncate_metrics(self, done: int) -> None:
        """Keep the records of rounds up to `done`; a torn or unreadable line is dropped."""
        if not self.metrics_path.exists():
            return
        kept, torn = [], 0
        for line in self.metrics_path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                torn += 1
                continue
            if isinstance(record, dict) and isinstance(record.get("round"), int) \
                    and record["round"] <= done:
                kept.append(line)
        if torn:
            warnings.warn(f"{self.metrics_path}: dropped {torn} unreadable line(s) (a run "
                          "killed while writing)", stacklevel=2)
        write_text(self.metrics_path, "".join(ln + "\n" for ln in kept))

    @contextmanager
    def metrics_log(self) -> Iterator[MetricsLog]:
        with self.metrics_path.open("a") as fh:
            yield MetricsLog(fh)

    # -- results -------------------------------------------------------------------------------
    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.path / "summary.json", summary)

    def write_matrix(self, index: int, members: list[int], matrix: np.ndarray) -> None:
        """The similarity matrix behind decision `index` (splits/split_NN.npz)."""
        folder = self.path / "splits"
        folder.mkdir(exist_ok=True)
        with atomic_open(folder / f"split_{index:02d}.npz", "wb") as fh:
            np.savez(fh, members=np.asarray(members), similarity=np.asarray(matrix))


class MetricsLog:
    """metrics.jsonl: one strict-JSON record per round, on the disk before the next round."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh

    def write(self, record: dict[str, Any]) -> None:
        self.fh.write(json_text(record) + "\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())
