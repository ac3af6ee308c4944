"""`fedflock run` with `engine: flower`: the experiment through Flower's simulation runtime.

It runs the Flower App in `examples/flower-deployment` with `flwr run` on a throw-away local
federation (`address = ":local:"`, one simulated SuperNode per client, Ray backend), then stops
the local SuperLink that `flwr` started for it. The run directory is the same as ever.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from fedflock.engines.flower.local import APP, flower_env
from fedflock.errors import FedflockError


def _stop_processes_mentioning(text: str) -> None:
    """Stop what `flwr` left running for this throw-away home (its detached SuperLink)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and int(entry.name) != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGTERM)


def run_simulation(config_path: Path, overrides: list[str], out: Path, clients: int,
                   timeout: float = 3600.0) -> dict[str, Any]:
    out = Path(out).resolve()
    with tempfile.TemporaryDirectory(prefix="fedflock-flwr-") as home:
        (Path(home) / "config.toml").write_text(
            '[superlink]\ndefault = "simulation"\n\n[superlink.simulation]\n'
            f'address = ":local:"\noptions.num-supernodes = {clients}\n'
            "options.backend.client-resources.num-cpus = 1\n")
        env = flower_env(Path(home)) | {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
        run_config = (f'config="{Path(config_path).resolve()}" out="{out}" '
                      f'set="{";".join(overrides)}"')
        log = out.parent / f"{out.name}.flower.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        try:
            with log.open("w") as fh:
                done = subprocess.run(
                    ["flwr", "run", str(APP), "simulation", "--stream", "--run-config",
                     run_config], env=env, stdout=fh, stderr=subprocess.STDOUT,
                    timeout=timeout, check=False)
        finally:
            _stop_processes_mentioning(home)
    error = out / "error.txt"
    if error.is_file():
        raise FedflockError(f"flower simulation failed: {error.read_text().strip()}")
    if done.returncode != 0 or not (out / "summary.json").is_file():
        raise FedflockError(f"flower simulation failed (exit {done.returncode}); see {log}")
    return json.loads((out / "summary.json").read_text())
