"""`engine: flower` in a config (`fedflock run`, `fedflock compare`, `fedflock.api`): the
experiment through Flower's simulation runtime.

It runs fedflock's Flower App (`fedflock.engines.flower.APP`, shipped inside the package) with
`flwr run` on a throw-away local federation (`address = ":local:"`, one simulated SuperNode per
client, Ray backend). `flwr` starts a local SuperLink of its own, which outlives `flwr run`:
every process started here carries a token (`OwnedProcesses`) and all of them, and only they,
are ended when the run is over, fails or is interrupted. The run directory is the same as ever.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedflock.config import ExperimentConfig, dump_config
from fedflock.engines.flower.local import APP, flower_env, free_port
from fedflock.engines.flower.processes import OwnedProcesses
from fedflock.errors import FedflockError
from fedflock.plugins import plugin_search_path


def simulate(config: ExperimentConfig, out: Path, resume: bool = False,
             plugins: Iterable[str] = (), timeout: float | None = None) -> dict[str, Any]:
    """A checked config through Flower's simulation runtime. Its YAML goes to a temporary file
    the Flower processes read (relative paths in it mean what they mean here). `plugins`:
    modules registering user components (`--plugin`), loaded by Flower's ServerApp and every
    ClientApp too; a `.py` file by its absolute path, as they run elsewhere. `timeout`: seconds
    before the run is ended (none by default: a long experiment is not an error)."""
    out = Path(out).resolve()
    modules = [str(Path(p).resolve()) if p.endswith(".py") else p for p in plugins]
    with tempfile.TemporaryDirectory(prefix="fedflock-flwr-") as home:
        path = Path(home) / "experiment.yaml"
        path.write_text(dump_config(config))
        (Path(home) / "config.toml").write_text(
            '[superlink]\ndefault = "simulation"\n\n[superlink.simulation]\n'
            f'address = ":local:"\noptions.num-supernodes = {config.data.clients}\n'
            "options.backend.client-resources.num-cpus = 1\n")
        # a local SuperLink of its own on free ports: on Flower's fixed defaults `flwr run`
        # would attach to another run's SuperLink, started with that run's environment
        env = flower_env(Path(home)) | {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                                        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
                                        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port())}
        search = [*filter(None, [env.get("PYTHONPATH")]), *plugin_search_path()]
        if search:
            env["PYTHONPATH"] = os.pathsep.join(search)
        run_config = (f'config="{path}" out="{out}" resume={str(resume).lower()} '
                      f'plugins="{";".join(modules)}"')
        log = out.parent / f"{out.name}.flower.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with OwnedProcesses(env) as owned, log.open("w") as fh:
            try:
                done = owned.run(["flwr", "run", str(APP), "simulation", "--stream",
                                  "--run-config", run_config], timeout=timeout, stdout=fh,
                                 stderr=subprocess.STDOUT)
            except subprocess.TimeoutExpired:
                raise FedflockError(f"flower simulation did not finish within {timeout:.0f} s; "
                                    f"see {log}") from None
    error = out / "error.txt"
    if error.is_file():
        raise FedflockError(f"flower simulation failed: {error.read_text().strip()}")
    if done.returncode != 0 or not (out / "summary.json").is_file():
        raise FedflockError(f"flower simulation failed (exit {done.returncode}); see {log}")
    return json.loads((out / "summary.json").read_text())
