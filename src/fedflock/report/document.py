"""`make_report`: the figures of a run or compare directory plus a report.md that embeds them.

Everything lands in DIR/report/ with relative image links, so the folder can be copied into a
paper's repository or viewed on any markdown renderer as is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedflock.errors import FedflockError
from fedflock.fileio import write_text
from fedflock.report import plots
from fedflock.report.load import (
    CompareData,
    RunData,
    finite,
    is_compare_dir,
    is_run_dir,
    load_compare,
    load_run,
)

Figure = tuple[Path, str, str]  # file, heading, caption

CAPTIONS = {
    "accuracy": "The headline metric per round (test accuracy, or perplexity for next-token "
                "tasks, on a log axis): mean over clients (solid) and the worst client "
                "(dashed); dotted vertical lines mark rounds in which a cluster split.",
    "clusters": "The headline metric of each final cluster's members per round (their mean), "
                "followed back to round 1: the curves part where the clusters split off, and "
                "a cluster whose members gain from the split falls (perplexity) or rises "
                "(accuracy) below or above the others after it.",
    "norms": "Split diagnostics per cluster: norm of the cluster's averaged update (solid) and "
             "the largest single-client update norm (dashed); CFL's eps rule splits a cluster "
             "once the averaged update vanishes while individual clients still move. The "
             "lower panel is the pseudo-F statistic the split test (CFL's automatic rule, "
             "incremental clustering's re-examination) compares with its threshold (of the "
             "best cut of the merge tree, or of its bipartition).",
    "split": "Cosine similarity of the clients' weight updates when the cluster split; rows and "
             "columns are ordered by the resulting parts (black lines) and the side strips "
             "show each client's true group.",
    "memberships": "Each client's soft membership of the shared models (rows sum to 1), "
                   "clients ordered by their true group (left strip); a method that finds "
                   "the groups gives each group one dark column.",
    "tree": "The cluster tree: every split of a cluster into its children; leaves are the final "
            "clusters, coloured by their majority true group with its share (purity).",
    "compare": "The headline metric (test accuracy, or perplexity for next-token tasks) per "
               "round for each algorithm: the line is the mean over seeds, "
               "the band spans the minimum to the maximum over seeds; left the mean over "
               "clients, right the worst client.",
}


def make_report(path: Path) -> list[Path]:
    """Write PNG figures and report.md into `path`/report; return the files written."""
    path = Path(path)
    if not path.is_dir():
        raise FedflockError(f"not a directory: {path}")
    out = path / "report"
    if is_run_dir(path):
        return _run_report(load_run(path), out)
    if is_compare_dir(path):
        return _compare_report(load_compare(path), out)
    raise FedflockError(f"{path}: neither a run directory (summary.json, metrics.jsonl) "
                        "nor a compare directory (compare.json, <algorithm>/seed<k>/)")


# -- figures -------------------------------------------------------------------------------
def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def run_figures(run: RunData, out: Path, prefix: str = "", accuracy: bool = True
                ) -> list[Figure]:
    """The per-run figures that this run has data for, written under `out`."""
    made: list[Figure] = []

    def add(maker: Callable[[Path], Path | None], name: str, heading: str, caption: str
            ) -> None:
        written = maker(out / f"{prefix}{name}.png")
        if written is not None:
            made.append((written, heading, caption))

    if accuracy:
        add(lambda p: plots.plot_run_accuracy(run, p), "accuracy",
            plots.metric_view(run).name.capitalize(), CAPTIONS["accuracy"])
    add(lambda p: plots.plot_cluster_curves(run, p), "clusters",
        f"{plots.metric_view(run).name.capitalize()} per cluster", CAPTIONS["clusters"])
    add(lambda p: plots.plot_norms(run, p), "norms", "Split diagnostics", CAPTIONS["norms"])
    for i, matrix in enumerate(run.matrices):
        d = matrix.decision
        split = run.splits[d] if d < len(run.splits) else {}
        when = f" (round {split['round']})" if "round" in split else ""
        add(lambda p, i=i: plots.plot_split_heatmap(run, i, p), f"split_{d:02d}",
            f"Split {d + 1}{when}", CAPTIONS["split"])
    add(lambda p: plots.plot_tree(run, p), "tree", "Cluster tree", CAPTIONS["tree"])
    add(lambda p: plots.plot_memberships(run, p), "memberships", "Memberships",
        CAPTIONS["memberships"])
    return made


# -- markdown ------------------------------------------------------------------------------
def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _pct(value: Any) -> str:
    number = finite(value)
    return f"{100 * number:.1f}" if number is not None else "–"


def _value(value: Any, view: plots.MetricView) -> str:
    return _pct(value) if view.bounded else plots.fmt_number(value, 2)


def summary_table(run: RunData) -> str:
    s = run.summary
    view = plots.metric_view(run)
    unit = " %" if view.bounded else ""
    if not s:
        last = run.metrics[-1] if run.metrics else {}
        stale = last.get("evaluated_round")  # nobody answered this round's evaluation
        source = f" (figures of round {stale}, the last evaluated)" if stale is not None else ""
        return ("summary.json is not written yet (run unfinished?); last logged round "
                f"{last.get('round', '–')}{source}: {view.name} "
                f"{_value(last.get(f'{view.name}_mean'), view)}{unit}, "
                f"worst {_value(last.get(f'{view.name}_worst'), view)}{unit}, "
                f"{last.get('num_clusters', '–')} clusters.\n")
    acc = s.get(view.name) or {}
    return _table(
        [f"{view.name}{unit}", f"worst{unit}", "clusters", "ARI", "rounds", "clients",
         "wall seconds"],
        [[_value(acc.get("mean"), view), _value(acc.get("worst"), view),
          str(s.get("num_clusters", "–")),
          plots.fmt_number(s.get("ari")), str(s.get("rounds", "–")), str(s.get("num_clients", "–")),
          plots.fmt_number(s.get("wall_seconds"), 1)]])


def clusters_table(run: RunData) -> str:
    clusters = run.summary.get("clusters") or []
    truth = run.true_groups
    if not clusters:
        return ""
    rows = []
    for k, members in enumerate(clusters):
        purity = plots.leaf_purity([int(m) for m in members], truth)
        rows.append([str(k), str(len(members)), ", ".join(map(str, members)),
                     f"{purity[0]} ({purity[1]:.0%})" if purity else "–"])
    return _table(["cluster", "size", "clients", "majority true group (purity)"], rows)


def splits_table(run: RunData) -> str:
    if not run.splits:
        return "No splits: the run kept its initial clusters.\n"
    rows = []
    for i, sp in enumerate(run.splits):
        children = ", ".join(map(str, sp.get("children") or []))
        rows.append([str(i + 1), str(sp.get("round", "–")), decided_by(sp),
                     f"{sp.get('parent', '–')} → {children}",
                     " + ".join(map(str, sp.get("sizes") or [])),
                     *(plots.fmt_number(sp.get(k)) for k in (
                         "alpha_intra_min", "alpha_cross_max", "gap", "gamma_max", "gamma_bound",
                         "pseudo_f", "kway_f", "mean_norm", "max_norm", "modularity",
                         "cross_ratio"))])
    return _table(["#", "round", "decided by", "cluster → children", "sizes", "α intra min",
                   "α cross max", "gap", "γ max", "γ bound", "pseudo-F (2 parts)",
                   "pseudo-F (best k)", "‖mean Δ‖", "max ‖Δ‖", "modularity", "cross ratio"],
                  rows)


RULES = {"recheck": "re-examination (split test)"}


def decided_by(split: dict[str, Any]) -> str:
    """What made a recorded decision: incremental clustering's Louvain communities (its
    modularity and cross ratio; the split test's score when it timed them), a
    re-examination by the split test, CFL's split test, or
    the decision's own kind (DistFL's clustering, IFCA's seeding)."""
    if split.get("rule") in RULES:
        return RULES[split["rule"]]
    if "modularity" in split:
        return "Louvain communities" + (", once the split test found groups"
                                        if split.get("when") == "groups" else "")
    if split.get("kind") == "split":
        return "split test" if "pseudo_f" in split else "split"  # (a plugin's: its parts)
    return str(split.get("kind", "–"))


def _figures_md(figures: list[Figure], level: str = "###") -> str:
    parts = []
    for file, heading, caption in figures:
        parts.append(f"{level} {heading}\n\n![{heading}]({file.name})\n\n*{caption}*\n")
    return "\n".join(parts)


def _write(out: Path, text: str) -> Path:
    path = out / "report.md"
    try:
        write_text(path, text)
    except OSError as err:
        raise FedflockError(f"{path}: cannot write ({err.strerror})") from None
    return path


def _run_report(run: RunData, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    figures = run_figures(run, out)
    text = "\n".join([
        f"# Report: {run.title()}\n",
        f"Run directory: `{run.path}`\n",
        "## Summary\n", summary_table(run),
        *(["## Final clusters\n", clusters_table(run)] if clusters_table(run) else []),
        "## Splits\n", splits_table(run),
        "## Figures\n", _figures_md(figures) or "No figures: no round was evaluated yet.\n",
    ])
    return [f for f, _, _ in figures] + [_write(out, text)]


def _compare_table(data: CompareData) -> str:
    if data.table_md:
        return data.table_md
    summaries = {a: [r.summary for r in runs] for a, runs in data.runs.items()}
    if all(s for runs in summaries.values() for s in runs):
        from fedflock.compare import markdown_table, summarise

        return markdown_table([summarise(a, s) for a, s in summaries.items()], data.seeds)
    return "compare.md is not written yet (comparison unfinished?).\n"


def _compare_report(data: CompareData, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    setting = next(iter(data.runs.values()))[0].setting()
    written: list[Path] = []
    sections = [f"# Comparison: {', '.join(data.runs)}" + (f" on {setting}" if setting else "")
                + "\n", f"Compare directory: `{data.path}`\n", "## Summary\n",
                _compare_table(data)]
    accuracy = plots.plot_compare_accuracy(data, out / "accuracy.png")
    if accuracy is not None:
        written.append(accuracy)
        sections.append(_figures_md([(accuracy, "Accuracy", CAPTIONS["compare"])], "##"))
    for algo, runs in data.runs.items():
        run = runs[0]  # seed 0 when it ran, else the first seed
        if not run.splits:
            continue
        figures = run_figures(run, out, prefix=f"{_safe(algo)}_", accuracy=True)
        written += [f for f, _, _ in figures]
        sections += [f"## {run.title()}\n", "### Splits\n", splits_table(run),
                     _figures_md(figures)]
    return [*written, _write(out, "\n".join(sections))]
