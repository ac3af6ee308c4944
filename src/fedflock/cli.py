"""`fedflock` command line: run, compare, report, assign, list.

Every user error is one line on stderr and exit status 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from fedflock.errors import FedflockError
from fedflock.fileio import write_json

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Clustered federated learning: find groups of compatible clients.")

@app.callback()
def _options(plugin: Annotated[list[str] | None, typer.Option(
        "--plugin", help="import a module (name or .py file) that registers components")] = None
             ) -> None:
    """Load plugins before any command, so their components are known to it."""
    from fedflock.plugins import load_plugins

    load_plugins(plugin or [])


SetOpt = Annotated[list[str] | None, typer.Option("--set", help="override: key.path=value")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")]


def _quiet(flag: bool) -> bool:
    return flag or os.environ.get("FEDFLOCK_QUIET") == "1" or not sys.stderr.isatty()


def _default_out(config: Path, name: str) -> Path:
    return Path("runs") / f"{config.stem}-{name}"


@app.command()
def run(config: Path, set_: SetOpt = None,
        out: Annotated[Path | None, typer.Option(help="run directory")] = None,
        resume: Annotated[bool, typer.Option(help="continue from the last checkpoint")] = False,
        quiet: QuietOpt = False) -> None:
    """Run one experiment and write its run directory."""
    from fedflock.experiment import run_experiment
    from fedflock.rundir import RunDirectory
    from fedflock.validation import load_config

    cfg = load_config(config, set_ or [])
    out = out or _default_out(config, f"{cfg.algorithm.name}-seed{cfg.seed}")
    if not resume:  # resuming compares it instead (a run's own config.yaml resumes it)
        RunDirectory(out).refuse_overwriting(config)
    # engine: flower goes through Flower's simulation runtime (`flwr run`)
    summary = run_experiment(cfg, out, resume=resume, quiet=_quiet(quiet))
    metric = summary.get("primary_metric", "accuracy")
    ari = "n/a" if summary["ari"] is None else f"{summary['ari']:.3f}"
    typer.echo(
        f"{summary['algorithm']}: {metric} {summary[metric]['mean']:.4f} "
        f"(worst {summary[metric]['worst']:.4f}), clusters {summary['num_clusters']}, "
        f"ARI {ari}, {summary['wall_seconds']:.1f}s -> {out}"
    )
    if summary.get("data_source"):
        typer.echo(f"{summary['dataset']} read from {summary['data_source']}")


@app.command()
def compare(config: Path,
            algorithms: Annotated[str, typer.Option(
                help="comma-separated names; the config's own algorithm keeps its "
                "parameters, the others run with their defaults")] = "cfl,fedavg",
            seeds: Annotated[str | None, typer.Option(
                help="comma-separated seeds (default: the config's seed)")] = None,
            set_: SetOpt = None,
            out: Annotated[Path | None, typer.Option(help="output directory")] = None,
            resume: Annotated[bool, typer.Option(
                help="continue the runs already there from their checkpoints")] = False,
            quiet: QuietOpt = False) -> None:
    """Run several algorithms (x seeds) on one config and print a side-by-side table."""
    from rich.console import Console
    from rich.table import Table

    from fedflock.compare import compare as run_compare
    from fedflock.compare import format_row, header
    from fedflock.validation import load_config

    cfg = load_config(config, set_ or [])
    seeds = str(cfg.seed) if seeds is None else seeds
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise FedflockError(f"--seeds {seeds!r}: expected comma-separated integers") from None
    names = [a.strip() for a in algorithms.split(",") if a.strip()]
    out = out or _default_out(config, "compare")
    rows = run_compare(cfg, names, seed_list, out, quiet=_quiet(quiet), resume=resume)
    table = Table(title=f"{cfg.data.dataset} / {cfg.data.scenario.kind} "
                        f"({cfg.data.clients} clients, seeds {seeds})")
    for col in header(rows):
        table.add_column(col, justify="left" if col == "algorithm" else "right")
    for row in rows:
        table.add_row(*format_row(row))
    Console(width=None if sys.stdout.isatty() else 120).print(table)
    typer.echo(f"runs and compare.md in {out}")


@app.command()
def report(run_dir: Path) -> None:
    """Plots (PNG) and a markdown report for a run or a compare directory."""
    from fedflock.report import make_report

    if not run_dir.is_dir():
        raise FedflockError(f"not a directory: {run_dir}")
    written = make_report(run_dir)
    typer.echo(f"wrote {len(written)} files to {run_dir / 'report'}")


@app.command()
def assign(run_dir: Path,
           clients: Annotated[int, typer.Option(min=1, help="new clients to place")] = 10,
           seed: Annotated[int | None, typer.Option(
               help="seed of the new clients' samples (default 1000, apart from run seeds)")
               ] = None,
           ) -> None:
    """Place new clients of the run's scenario into its clusters (CFL: via the parameter tree;
    other methods: the cluster model that scores best on the client's own data)."""
    from fedflock.assign import assign_new_clients

    result = assign_new_clients(run_dir, clients, seed)
    metric = result["metric"]
    for row in result["clients"]:
        serves = "no group" if row["cluster_group"] is None else f"group {row['cluster_group']}"
        typer.echo(f"client {row['client']:3d} (group {row['true_group']}) -> cluster "
                   f"{row['cluster']} (serves {serves}), {metric} {row[metric]:.3f}")
    typer.echo(f"placed in its own group's cluster: {result['routed_correctly']:.0%}, "
               f"ARI of the new clients {result['ari']:.2f}, "
               f"mean {metric} {result[metric + '_mean']:.4f}")
    write_json(run_dir / "assign.json", result)


@app.command("flower-app")
def flower_app() -> None:
    """Print the folder of fedflock's Flower App, for `flwr run "$(fedflock flower-app)" ...`."""
    from fedflock.engines.flower.local import APP

    typer.echo(str(APP))


deploy = typer.Typer(no_args_is_help=True, help="Prepare a Flower deployment.")
app.add_typer(deploy, name="deploy")


@deploy.command("init")
def deploy_init(
        out: Annotated[Path, typer.Option("--out", help="folder for certificates and keys")],
        nodes: Annotated[int, typer.Option("--nodes", min=1, help="SuperNodes (one per client)")],
        host: Annotated[list[str] | None, typer.Option(
            "--host", help="address the SuperNodes dial besides 127.0.0.1 (repeatable)")] = None,
        port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 9091,
        force: Annotated[bool, typer.Option(
            "--force", help="replace the credentials already in --out")] = False) -> None:
    """Write a CA, a SuperLink certificate and one key pair per SuperNode, and print the exact
    commands for a TLS deployment that admits only registered SuperNodes."""
    from fedflock.engines.flower.credentials import (
        deployment_commands,
        existing_credentials,
        write_credentials,
    )

    if out.exists() and not out.is_dir():
        raise FedflockError(f"--out {out}: exists and is not a folder")
    held = existing_credentials(out) if out.is_dir() else []
    if held and not force:
        raise FedflockError(f"--out {out}: already holds credentials ({', '.join(held[:3])}"
                            f"{', ...' if len(held) > 3 else ''}); new ones would lock out every "
                            "node set up with them (--force replaces them)")
    credentials = write_credentials(out, nodes, host or [])
    typer.echo(f"wrote ca.crt, server.pem, server.key and node0..{nodes - 1}.key/.pub to "
               f"{credentials.folder} (keys readable by you only); ca.key signs certificates "
               "every node trusts: keep it off the devices\n")
    typer.echo(deployment_commands(credentials, (host or ["127.0.0.1"])[0], port))


@app.command("list")
def list_components(
        params: Annotated[str | None, typer.Option(
            "--params", help="an algorithm's parameters: type, default, description")] = None,
) -> None:
    """Datasets, scenarios, models, algorithms, tasks, objectives, attacks, similarity
    measures and executors; or one algorithm's parameters (`--params NAME`)."""
    from fedflock.algorithms import ALGORITHMS
    from fedflock.client.executors import EXECUTORS
    from fedflock.client.objectives import OBJECTIVES
    from fedflock.client.tasks import CRITERIA
    from fedflock.data import DATASETS, SCENARIO_DOCS, SCENARIOS
    from fedflock.models import MODELS
    from fedflock.robust import POISONINGS
    from fedflock.similarity.incremental import MEASURES
    from fedflock.wire import TASKS

    if params is not None:
        _print_params(params, ALGORITHMS.get(params), ALGORITHMS.describe()[params])
        return

    sections = {
        "datasets": DATASETS.describe(),
        "scenarios": SCENARIO_DOCS | SCENARIOS.describe(),
        "models": MODELS.describe(),
        "algorithms": ALGORITHMS.describe(),
        "client tasks": TASKS.describe(),
        "selection criteria (select task)": CRITERIA.describe(),
        "objectives": OBJECTIVES.describe(),
        "attacks (attack.kind)": POISONINGS.describe()
        | {"label_flip": "trains on labels mapped by attack.label_map (0-3 <-> 4-7)"},
        "similarity measures (incremental)": MEASURES.describe(),
        "executors": EXECUTORS.describe() | {"auto": "fastest for this device (default)"},
    }
    for title, items in sections.items():
        typer.echo(f"{title}:")
        width = max(len(k) for k in items)
        for name, doc in items.items():
            typer.echo(f"  {name:<{width}}  {doc}")


def _print_params(name: str, cls: type, doc: str) -> None:
    """One line per parameter of an algorithm's schema: name, type, default, description."""
    from fedflock.algorithms.describe import parameter_groups

    groups = parameter_groups(cls.Params)
    typer.echo(f"{name}: {doc}")
    if not groups:
        typer.echo("  (no parameters)")
        return
    rows = [r for _, group in groups for r in group]
    widths = [max(len(getattr(r, key)) for r in rows) for key in ("name", "kind", "default")]
    for title, group in groups:
        indent = "    " if title else "  "
        if title:
            typer.echo(f"  {title}:")
        for r in group:
            typer.echo(f"{indent}{r.name:<{widths[0]}}  {r.kind:<{widths[1]}}  "
                       f"{r.default:<{widths[2]}}  {r.description}")


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, line: str | None = None) -> str:
    return f"warning: {message}\n"


def main() -> None:
    import warnings

    warnings.formatwarning = _one_line_warning
    try:
        code = app(standalone_mode=False)
    except FedflockError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except (typer.Exit, SystemExit) as done:
        code = getattr(done, "exit_code", getattr(done, "code", 0))
        sys.exit(code)
    except Exception as err:  # click usage errors
        import click

        if isinstance(err, click.ClickException):
            typer.echo(f"error: {err.format_message()}", err=True)
            sys.exit(2)
        if isinstance(err, click.exceptions.Abort):
            sys.exit(130)
        raise
    if isinstance(code, int) and code:  # click returns 130 on Ctrl-C instead of raising
        if code == 130:
            typer.echo("error: interrupted", err=True)
        sys.exit(code)


if __name__ == "__main__":
    main()
