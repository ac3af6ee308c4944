"""The fedflock ServerApp: any fedflock algorithm, driven over Flower's Grid.

`resume` in the run config continues the run in `out` from its checkpoint, exactly as
`fedflock run --resume`; without it a directory that holds a run is refused (never resumed
silently)."""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedflock.engines.flower.engine import FlowerEngine
from fedflock.engines.flower.settings import experiment_config
from fedflock.experiment import Run

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    out = Path(str(context.run_config.get("out", "runs/flower")))
    out.mkdir(parents=True, exist_ok=True)
    (out / "error.txt").unlink(missing_ok=True)  # a previous attempt's
    try:
        config = experiment_config(context.run_config)
        timeout = float(context.run_config.get("round-timeout", 120.0))
        resume = str(context.run_config.get("resume", False)).lower() == "true"
        engine = FlowerEngine(grid, config, timeout=timeout)
        Run(config, out, quiet=True).execute(resume=resume, engine=engine)
    except Exception as err:  # the ServerApp's output is not shown by `flwr run`: keep it
        (out / "error.txt").write_text(f"{type(err).__name__}: {err}\n")
        raise
