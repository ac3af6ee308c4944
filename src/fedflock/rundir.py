"""The run directory: config.yaml, metrics.jsonl, summary.json, checkpoints/, splits/.

Everything written here is written atomically (a temporary file, then a rename), so a run killed
at any moment leaves the last complete checkpoint and summary behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from fedflock.errors import FedflockError


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


class RunDirectory:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoints" / "last.pt"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    def prepare(self, config_text: str, resume: bool) -> None:
        """A fresh directory for a new run, or the checks that a resume continues this one."""
        if resume:
            if not self.checkpoint_path.is_file():
                raise FedflockError(f"--resume: no checkpoint in {self.path / 'checkpoints'}")
            if (self.path / "config.yaml").read_text() != config_text:
                raise FedflockError(f"--resume: config differs from {self.path / 'config.yaml'}")
            return
        if self.metrics_path.exists():
            raise FedflockError(
                f"run directory {self.path} already holds a run; use --resume or another --out"
            )
        (self.path / "checkpoints").mkdir(parents=True, exist_ok=True)
        (self.path / "config.yaml").write_text(config_text)

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        tmp = self.checkpoint_path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(self.checkpoint_path)

    def load_checkpoint(self) -> dict[str, Any]:
        """The last checkpoint; the metrics logged after it are dropped (they are re-run)."""
        state = torch.load(self.checkpoint_path, weights_only=False)
        done = state["round"]
        if self.metrics_path.exists():
            lines = [ln for ln in self.metrics_path.read_text().splitlines()
                     if ln and json.loads(ln)["round"] <= done]
            self.metrics_path.write_text("".join(ln + "\n" for ln in lines))
        return state

    def metrics_log(self) -> IO[str]:
        return self.metrics_path.open("a")

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.path / "summary.json", summary)

    def write_matrices(self, matrices: list[tuple[list[int], np.ndarray]]) -> None:
        """The similarity matrix behind each decision that kept one (splits/split_NN.npz)."""
        if not matrices:
            return
        folder = self.path / "splits"
        folder.mkdir(exist_ok=True)
        for i, (members, matrix) in enumerate(matrices):
            np.savez(folder / f"split_{i:02d}.npz", members=np.asarray(members),
                     similarity=np.asarray(matrix))
