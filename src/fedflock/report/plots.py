"""The report's figures: accuracy curves (overall and per cluster), split diagnostics, split
heatmaps, cluster tree.

Figures are built on `matplotlib.figure.Figure` directly (rendered by the Agg canvas) rather
than through pyplot, so making a report never switches the caller's backend or leaks global
figure state. Every function returns the PNG it wrote, or None when the run holds nothing to
draw (for example no splits), so the caller can list exactly what exists.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap, to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import ScalarFormatter
from mpl_toolkits.axes_grid1 import make_axes_locatable

from fedflock.errors import FedflockError
from fedflock.report.load import CompareData, RunData, finite

DPI = 150
# Okabe & Ito (2008): distinguishable under the common colour-vision deficiencies. The yellow
# is last because it is hard to see as a thin line on white.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000",
           "#F0E442")
SIMILARITY_CMAP = "RdBu_r"  # diverging, ColorBrewer-rated colour-blind safe; 0 is white
STYLE = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
    "xtick.labelsize": 9, "ytick.labelsize": 9, "axes.spines.top": False,
    "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.25, "grid.linewidth": 0.6,
}
MAX_LEGEND_CLUSTERS = 10


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def tint(hex_colour: str, white: float = 0.62) -> tuple[float, float, float]:
    """An opaque pastel of a palette colour, light enough for black text on top."""
    rgb = np.array(to_rgb(hex_colour))
    r, g, b = (1 - white) * rgb + white
    return float(r), float(g), float(b)


@contextmanager
def _style() -> Iterator[None]:
    """Paper-sized fonts for this figure only (rc_context restores the caller's settings)."""
    with mpl.rc_context(STYLE):
        yield


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=DPI, bbox_inches="tight", facecolor="white")
    except OSError as err:
        raise FedflockError(f"{path}: cannot write ({err.strerror})") from None
    return path


def _mark_splits(ax: Axes, rounds: Sequence[int]) -> Line2D | None:
    """Faint vertical lines at split rounds; returns a handle for the legend."""
    handle = None
    for r in sorted(set(rounds)):
        handle = ax.axvline(r, color="0.45", linestyle=":", linewidth=1.0, alpha=0.7, zorder=0)
    if handle is None:
        return None
    return Line2D([], [], color="0.45", linestyle=":", linewidth=1.0, label="split")


def _integer_rounds(ax: Axes) -> None:
    ax.xaxis.get_major_locator().set_params(integer=True)


# -- the headline metric per round --------------------------------------------------------
@dataclass(frozen=True)
class MetricView:
    """How the report draws a run's primary metric (summary.json `primary_metric`)."""

    name: str
    axis: str
    scale: float  # accuracy is drawn in %
    bounded: bool  # a 0-100 axis

    @property
    def title(self) -> str:
        return f"test {self.name}"


def metric_view(run: RunData) -> MetricView:
    name = run.summary.get("primary_metric") or next(
        (k.removesuffix("_mean") for rec in run.metrics for k in rec
         if k in ("accuracy_mean", "perplexity_mean")), "accuracy")
    if name == "accuracy":
        return MetricView("accuracy", "test accuracy (%)", 100.0, True)
    return MetricView(name, f"test {name}", 1.0, False)


def _metric_axis(ax: Axes, view: MetricView) -> None:
    """0-100 for accuracy; a log axis in plain numbers for perplexity (it falls by factors)."""
    if view.bounded:
        ax.set_ylim(0, 100)
        return
    ax.set_yscale("log")
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis(ScalarFormatter())


def accuracy_series(run: RunData, key: str = "accuracy_mean", scale: float = 100.0
                    ) -> dict[int, float]:
    """Round -> the metric `key` (accuracy in %), skipping rounds that were not evaluated,
    lack the field or repeat an earlier round's figures (`evaluated_round`: nobody answered
    that round)."""
    out = {}
    for rec in run.metrics:
        value = None if "evaluated_round" in rec else finite(rec.get(key))
        if value is not None:
            out[int(rec["round"])] = scale * value
    return out


def _round_axes(ax: Axes, run: RunData, view: MetricView, title: str) -> None:
    """A per-round metric axis: split rounds marked, labels, the metric's scale, a legend."""
    handles, _ = ax.get_legend_handles_labels()
    split = _mark_splits(ax, run.split_rounds)
    if split is not None:
        handles.append(split)
    ax.set(xlabel="communication round", ylabel=view.axis, title=title)
    _metric_axis(ax, view)
    _integer_rounds(ax)
    if handles:
        ax.legend(handles=handles, loc="best", frameon=False)


def plot_run_accuracy(run: RunData, path: Path) -> Path | None:
    """Mean and worst client of the run's primary metric per round (accuracy, perplexity),
    split rounds marked."""
    view = metric_view(run)
    mean = accuracy_series(run, f"{view.name}_mean", view.scale)
    worst = accuracy_series(run, f"{view.name}_worst", view.scale)
    if not mean:
        return None
    with _style():
        fig = Figure(figsize=(6.4, 4.0))
        ax = fig.add_subplot()
        ax.plot(list(mean), list(mean.values()), color=colour(0), linewidth=2.0,
                marker="o" if len(mean) <= 30 else None, markersize=3.5, label="mean over clients")
        if worst:
            ax.plot(list(worst), list(worst.values()), color=colour(3), linewidth=1.6,
                    linestyle="--", label="worst client")
        _round_axes(ax, run, view, f"Client {view.title}: {run.title()}")
        return _save(fig, path)


def cluster_curves(run: RunData) -> dict[int, dict[int, float]]:
    """Final cluster -> round -> its members' mean of the primary metric: the clients grouped
    as the run ended, followed back through every evaluated round (so the curves part where
    the clusters did). Empty with fewer than two final clusters."""
    view = metric_view(run)
    clusters = run.summary.get("clusters") or []
    if len(clusters) < 2:
        return {}
    curves: dict[int, dict[int, float]] = {i: {} for i in range(len(clusters))}
    for rec in run.metrics:
        per_client = rec.get(view.name)
        if "evaluated_round" in rec or not isinstance(per_client, list):
            continue
        for i, members in enumerate(clusters):
            values = [finite(per_client[c]) for c in members if c < len(per_client)]
            values = [v for v in values if v is not None]
            if values:
                curves[i][int(rec["round"])] = view.scale * float(np.mean(values))
    return {i: curve for i, curve in curves.items() if curve}


def plot_cluster_curves(run: RunData, path: Path) -> Path | None:
    """The primary metric per final cluster and round (`cluster_curves`), splits marked."""
    curves = cluster_curves(run)
    if len(curves) < 2:
        return None
    view = metric_view(run)
    truth = run.summary.get("true_groups")
    names = []
    for members in run.summary["clusters"]:
        purity = leaf_purity(members, truth)
        names.append(f"{len(members)} clients" + (
            f", {purity[1]:.0%} group {purity[0]}" if purity else ""))
    with _style():
        fig = Figure(figsize=(6.4, 4.0))
        ax = fig.add_subplot()
        legend = len(curves) <= MAX_LEGEND_CLUSTERS
        for i, curve in curves.items():
            ax.plot(list(curve), list(curve.values()), color=colour(i), linewidth=1.6,
                    marker="o" if len(curve) <= 30 else None, markersize=3,
                    label=f"cluster {i} ({names[i]})" if legend else None)
        _round_axes(ax, run, view,
                    f"{view.title.capitalize()} per final cluster: {run.title()}")
        return _save(fig, path)


def _seed_band(runs: list[RunData], key: str, scale: float) -> tuple[np.ndarray, ...] | None:
    """Rounds, and mean/min/max over seeds of `key` (each round over the seeds that have it)."""
    series = [accuracy_series(r, key, scale) for r in runs]
    rounds = sorted({rnd for s in series for rnd in s})
    if not rounds:
        return None
    stats = [[s[rnd] for s in series if rnd in s] for rnd in rounds]
    return (np.array(rounds), np.array([np.mean(v) for v in stats]),
            np.array([min(v) for v in stats]), np.array([max(v) for v in stats]))


def plot_compare_accuracy(data: CompareData, path: Path) -> Path | None:
    """Per algorithm: mean over seeds (line) and min-max over seeds (band); mean and worst."""
    view = metric_view(next(iter(data.runs.values()))[0])
    panels = [(f"{view.name}_mean", f"mean client {view.name}"),
              (f"{view.name}_worst", "worst client")]
    bands = {key: {a: _seed_band(runs, key, view.scale) for a, runs in data.runs.items()}
             for key, _ in panels}
    panels = [(k, t) for k, t in panels if any(b is not None for b in bands[k].values())]
    if not panels:
        return None
    n_seeds = max(len(runs) for runs in data.runs.values())
    with _style():
        fig = Figure(figsize=(5.2 * len(panels), 4.0))
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
        for ax, (key, title) in zip(axes, panels, strict=True):
            for i, (algo, band) in enumerate(bands[key].items()):
                if band is None:
                    continue
                rounds, mean, low, high = band
                ax.plot(rounds, mean, color=colour(i), linewidth=2.0, label=algo)
                if n_seeds > 1:
                    ax.fill_between(rounds, low, high, color=colour(i), alpha=0.18, linewidth=0)
            ax.set(xlabel="communication round", title=title)
            _metric_axis(ax, view)
            _integer_rounds(ax)
        axes[0].set_ylabel(view.axis)
        axes[0].legend(loc="best", frameon=False)
        seeds = ", ".join(map(str, data.seeds))
        spread = "line: mean, band: min-max over seeds" if n_seeds > 1 else "one seed"
        fig.suptitle(f"{view.title.capitalize()} per round (seeds {seeds}; {spread})",
                     fontsize=11)
        return _save(fig, path)


# -- split diagnostics ---------------------------------------------------------------------
def _thresholds(run: RunData, statistic: str) -> list[tuple[str, float]]:
    """(label, value) of the decision thresholds the run's algorithm declared on `statistic`
    (summary.json `thresholds`): the report draws them without knowing the algorithm."""
    out = []
    for t in run.summary.get("thresholds") or []:
        value = finite(t.get("value")) if isinstance(t, dict) else None
        if value is not None and t.get("statistic") == statistic:
            out.append((str(t.get("label") or statistic), value))
    return out


SPLIT_FIGURES = {"kway_f": "pseudo-F of the best cut of the merge tree",
                 "pseudo_f": "pseudo-F of best bipartition"}


def split_figure(run: RunData) -> str:
    """The split statistic the run's threshold is on (older runs: the bipartition's)."""
    named = [t.get("statistic") for t in run.summary.get("thresholds") or []
             if isinstance(t, dict)]
    return next((s for s in named if s in SPLIT_FIGURES), "pseudo_f")


def norm_series(run: RunData) -> dict[int, dict[str, list[float]]]:
    """Cluster id -> {round, mean, max, f} lists, from the per-round cluster records (f: the
    split statistic the run decides by)."""
    out: dict[int, dict[str, list[float]]] = {}
    figure = split_figure(run)
    for rec in run.metrics:
        for cl in rec.get("clusters") or []:
            if not isinstance(cl, dict) or "id" not in cl:
                continue
            mean, top = finite(cl.get("mean_norm")), finite(cl.get("max_norm"))
            row = out.setdefault(int(cl["id"]), {k: [] for k in
                                                 ("round", "mean", "max", "f_round", "f")})
            if mean is not None and top is not None:
                row["round"].append(rec["round"])
                row["mean"].append(mean)
                row["max"].append(top)
            f = finite(cl.get(figure))
            if f is not None:
                row["f_round"].append(rec["round"])
                row["f"].append(f)
    return {k: v for k, v in sorted(out.items()) if v["round"] or v["f_round"]}


def plot_norms(run: RunData, path: Path) -> Path | None:
    """Per cluster: norm of the mean update (solid) and the largest client update (dashed).

    CFL splits when the mean update vanishes while single clients still move (stationary
    point of the joint objective, not of the clients'); a panel of the pseudo-F statistic
    used by the `auto` rule is added when the run logged it.
    """
    series = norm_series(run)
    if not any(s["round"] for s in series.values()):
        return None
    has_f = any(s["f"] for s in series.values())
    legend_clusters = len(series) <= MAX_LEGEND_CLUSTERS
    with _style():
        fig = Figure(figsize=(6.8, 6.4 if has_f else 4.2))
        axes = fig.subplots(2 if has_f else 1, 1, sharex=True, squeeze=False)[:, 0]
        ax = axes[0]
        marker = "o" if len(run.metrics) <= 30 else None
        for i, (cid, s) in enumerate(series.items()):
            ax.plot(s["round"], s["mean"], color=colour(i), linewidth=1.8, marker=marker,
                    markersize=3, label=f"cluster {cid}" if legend_clusters else None)
            ax.plot(s["round"], s["max"], color=colour(i), linewidth=1.4, linestyle="--",
                    marker=marker, markersize=3, markerfacecolor="white")
        handles, _ = ax.get_legend_handles_labels()
        handles += [Line2D([], [], color="0.2", linewidth=1.8, label=r"$\|$mean update$\|$"),
                    Line2D([], [], color="0.2", linestyle="--", linewidth=1.4,
                           label=r"max client $\|$update$\|$")]
        for statistic, style in (("mean_norm", "-."), ("max_norm", (0, (1, 3)))):
            for label, value in _thresholds(run, statistic):
                ax.axhline(value, color="0.5", linestyle=style, linewidth=1.0)
                handles.append(Line2D([], [], color="0.5", linestyle=style, linewidth=1.0,
                                      label=f"{label} = {value:g}"))
        split = _mark_splits(ax, run.split_rounds)
        for other in axes[1:]:
            _mark_splits(other, run.split_rounds)
        if split is not None:
            handles.append(split)
        ax.set(ylabel="update norm", title=f"Split diagnostics: {run.title()}")
        ax.set_ylim(bottom=0)
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        if has_f:
            fax = axes[1]
            for i, s in enumerate(series.values()):
                fax.plot(s["f_round"], s["f"], color=colour(i), linewidth=1.6, marker=marker,
                         markersize=3)
            for label, threshold in _thresholds(run, split_figure(run)):
                fax.axhline(threshold, color="0.3", linestyle="-.", linewidth=1.0)
                fax.legend(handles=[Line2D([], [], color="0.3", linestyle="-.", linewidth=1.0,
                                           label=f"{label} {threshold:g}")],
                           loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
            fax.set(ylabel=SPLIT_FIGURES[split_figure(run)])
            fax.set_ylim(bottom=0)
        axes[-1].set_xlabel("communication round")
        _integer_rounds(axes[-1])
        return _save(fig, path)


# -- similarity at a split -----------------------------------------------------------------
def split_order(members: list[int], split: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Matrix rows ordered part by part, then by client id; and the size of each part."""
    pos = {c: i for i, c in enumerate(members)}
    recorded = split.get("members")
    if not (isinstance(recorded, list) and all(isinstance(p, list) for p in recorded)):
        recorded = []  # runs written before re-examination splits kept their parts held a count
    parts = [sorted(int(c) for c in part if int(c) in pos) for part in recorded]
    if sum(len(p) for p in parts) != len(members) or len({c for p in parts for c in p}) != len(
            members):
        parts = [sorted(members)]  # no (consistent) record of the parts: client order only
    return [pos[c] for part in parts for c in part], [len(p) for p in parts]


def fmt_number(value: Any, digits: int = 3) -> str:
    """A table cell: fixed-point, or scientific from a million on (a diverging model's update
    norms reach 1e16, which fixed-point would spell out digit by digit)."""
    number = finite(value)
    if number is None:
        return "∞" if isinstance(value, float) and value == float("inf") else "–"
    return f"{number:.{digits}e}" if abs(number) >= 1e6 else f"{number:.{digits}f}"


def _group_strip(ax: Axes, groups: np.ndarray, cmap: ListedColormap, vertical: bool) -> None:
    ax.imshow(groups[:, None] if vertical else groups[None, :], cmap=cmap, aspect="auto",
              vmin=-0.5, vmax=cmap.N - 0.5, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    for spine in ax.spines.values():
        spine.set_visible(False)


def plot_split_heatmap(run: RunData, index: int, path: Path) -> Path | None:
    """Cosine similarity of the clients' updates at the `index`-th saved matrix, grouped by the
    parts of the decision it belongs to."""
    if index >= len(run.matrices):
        return None
    matrix = run.matrices[index]
    split = run.splits[matrix.decision] if matrix.decision < len(run.splits) else {}
    order, sizes = split_order(matrix.members, split)
    sim = matrix.similarity[np.ix_(order, order)]
    clients = [matrix.members[i] for i in order]
    n = len(clients)
    truth = run.reference_groups
    groups = np.array([truth[c] for c in clients]) if truth and max(clients) < len(truth) else None
    with _style(), mpl.rc_context({"axes.grid": False}):
        fig = Figure(figsize=(6.6, 6.0))
        ax = fig.add_subplot()
        image = ax.imshow(sim, cmap=SIMILARITY_CMAP, vmin=-1, vmax=1, interpolation="nearest")
        edge = -0.5
        for size in sizes[:-1]:
            edge += size
            ax.axhline(edge, color="black", linewidth=2.0)
            ax.axvline(edge, color="black", linewidth=2.0)
        step = max(1, int(np.ceil(n / 32)))
        ticks = list(range(0, n, step))
        ax.set_xticks(ticks, [str(clients[t]) for t in ticks], rotation=90 if n > 16 else 0)
        ax.set_yticks(ticks, [str(clients[t]) for t in ticks])
        part_text = " | ".join(f"part {chr(65 + i)} ({s})" for i, s in enumerate(sizes))
        ax.set_xlabel(f"client id, ordered by {part_text}" if len(sizes) > 1 else "client id")
        ax.set_ylabel("client id")
        divider = make_axes_locatable(ax)
        handles = []
        if groups is not None:
            names = sorted(set(truth or []))
            cmap = ListedColormap([colour(g) for g in range(len(names))])
            index_of = {g: i for i, g in enumerate(names)}
            codes = np.array([index_of[g] for g in groups])
            _group_strip(divider.append_axes("right", size="3.5%", pad=0.06), codes, cmap, True)
            _group_strip(divider.append_axes("top", size="3.5%", pad=0.06), codes, cmap, False)
            handles = [Patch(color=colour(i), label=g)
                       for i, g in enumerate(names) if g in set(groups.tolist())]
        cax = divider.append_axes("right", size="4.5%", pad=0.5 if groups is not None else 0.15)
        fig.colorbar(image, cax=cax, label="cosine similarity of updates")
        lines = [f"Split {index + 1}" + (f" at round {split['round']}" if "round" in split else "")]
        if "parent" in split:
            children = ", ".join(map(str, split.get("children") or []))
            lines[0] += f": cluster {split['parent']} → {children}"
        detail = (f"Louvain modularity = {fmt_number(split['modularity'])}"
                  if "modularity" in split else
                  rf"$\alpha_{{intra}}^{{min}}$ = {fmt_number(split.get('alpha_intra_min'))},  "
                  rf"$\alpha_{{cross}}^{{max}}$ = {fmt_number(split.get('alpha_cross_max'))}")
        if groups is not None and len(sizes) > 1:
            # A split is right when no true group is cut in two (a first split of 4 groups
            # into 1 + 3 is right though its ARI against the 4 groups is low).
            labels = np.repeat(np.arange(len(sizes)), sizes)
            whole = all(len(set(labels[np.asarray(groups) == g])) == 1 for g in set(groups))
            what = "groups" if run.summary.get("attack") else "true groups"
            detail += f",  {what} kept whole: {'yes' if whole else 'NO'}"
        fig.suptitle("\n".join([*lines, detail]) if split else lines[0], fontsize=11)
        if handles:
            fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5),
                       frameon=False, bbox_to_anchor=(0.5, -0.04))
        return _save(fig, path)


def plot_memberships(run: RunData, path: Path) -> Path | None:
    """The soft memberships (clients x clusters) of a method that has them, clients ordered by
    true group and then by their largest weight, the true group in a side strip."""
    soft = run.summary.get("memberships")
    if not soft:
        return None
    weights = np.asarray(soft, dtype=float)
    truth = run.true_groups
    hard = weights.argmax(1)
    keys = [(truth[c] if truth else 0, int(hard[c]), c) for c in range(len(weights))]
    order = [c for *_, c in sorted(keys)]
    with _style(), mpl.rc_context({"axes.grid": False}):
        fig = Figure(figsize=(max(4.0, 0.9 * weights.shape[1] + 2.5), 6.0))
        ax = fig.add_subplot()
        image = ax.imshow(weights[order], cmap="Blues", vmin=0, vmax=1, aspect="auto",
                          interpolation="nearest")
        ax.set_xticks(range(weights.shape[1]))
        ax.set_xlabel("cluster (shared model)")
        ax.set_ylabel(f"client ({len(order)}), ordered by true group" if truth else "client")
        ax.set_yticks([])
        divider = make_axes_locatable(ax)
        if truth:
            names = sorted(set(truth))
            cmap = ListedColormap([colour(g) for g in range(len(names))])
            codes = np.array([names.index(truth[c]) for c in order])
            _group_strip(divider.append_axes("left", size="6%", pad=0.06), codes, cmap, True)
            fig.legend(handles=[Patch(color=colour(i), label=f"group {g}")
                                for i, g in enumerate(names)], loc="lower center",
                       ncol=min(len(names), 5), frameon=False, bbox_to_anchor=(0.5, -0.04))
        fig.colorbar(image, cax=divider.append_axes("right", size="5%", pad=0.1),
                     label="membership weight")
        ax.set_title(f"Memberships: {run.title()}")
        return _save(fig, path)


# -- cluster tree --------------------------------------------------------------------------
def tree_layout(nodes: dict[int, dict[str, Any]]) -> dict[int, tuple[float, int]]:
    """(x, depth) per node: leaves left to right in depth-first order, parents centred."""
    roots = [n for n, node in nodes.items() if node.get("parent") not in nodes]
    place: dict[int, tuple[float, int]] = {}
    next_x = 0.0

    def visit(nid: int, depth: int) -> float:
        nonlocal next_x
        kids = [k for k in nodes[nid].get("children") or [] if k in nodes and k not in place]
        if not kids:
            x = next_x
            next_x += 1.0
        else:
            place[nid] = (0.0, depth)  # guards against cycles in a corrupt tree
            x = float(np.mean([visit(k, depth + 1) for k in kids]))
        place[nid] = (x, depth)
        return x

    for root in sorted(roots):
        visit(root, 0)
    return place


def leaf_purity(members: list[int], truth: list[int] | None) -> tuple[int, float] | None:
    """Majority true group of a cluster and the fraction of its members in that group."""
    if not truth or not members or max(members) >= len(truth):
        return None
    group, count = Counter(truth[c] for c in members).most_common(1)[0]
    return group, count / len(members)


def plot_tree(run: RunData, path: Path) -> Path | None:
    """The cluster tree: one box per cluster, leaves coloured by majority true group."""
    nodes = {int(n["id"]): n for n in run.tree if isinstance(n, dict) and "id" in n}
    if len(nodes) < 2:
        return None
    place = tree_layout(nodes)
    truth = run.true_groups
    groups = sorted(set(truth)) if truth else []
    n_leaves = sum(1 for n in nodes.values() if not n.get("children"))
    depth = max(d for _, d in place.values())
    with _style(), mpl.rc_context({"axes.grid": False}):
        fig = Figure(figsize=(max(5.0, 2.1 * n_leaves), max(3.2, 1.4 * (depth + 1))))
        ax = fig.add_subplot()
        for nid, node in nodes.items():
            parent = node.get("parent")
            if parent in place and nid in place:
                (x0, d0), (x1, d1) = place[parent], place[nid]
                ax.plot([x0, x1], [-d0, -d1], color="0.35", linewidth=1.3, zorder=1)
        used = set()
        for nid, (x, d) in place.items():
            node = nodes[nid]
            members = [int(m) for m in node.get("members") or []]
            text = f"cluster {nid}\n{len(members)} client{'s' if len(members) != 1 else ''}"
            face, edge = "#EEEEEE", "0.4"
            if node.get("children"):
                if node.get("split_round") is not None:
                    text += f"\nsplit at round {node['split_round']}"
            else:
                purity = leaf_purity(members, truth)
                if purity is not None:
                    group, share = purity
                    text += f"\ngroup {group} ({share:.0%})"
                    edge = colour(groups.index(group))
                    face = tint(edge)
                    used.add(group)
            ax.text(x, -d, text, ha="center", va="center", fontsize=9, zorder=2,
                    bbox={"boxstyle": "round,pad=0.45", "facecolor": face, "edgecolor": edge,
                          "linewidth": 1.5})
        xs = [x for x, _ in place.values()]
        ax.set_xlim(min(xs) - 0.7, max(xs) + 0.7)
        ax.set_ylim(-depth - 0.6, 0.6)
        ax.axis("off")
        ax.set_title(f"Cluster tree: {run.title()}")
        if used:
            ax.legend(handles=[Patch(facecolor=tint(colour(groups.index(g))),
                                     edgecolor=colour(groups.index(g)),
                                     label=f"final cluster, mostly group {g}")
                               for g in sorted(used)],
                      loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        return _save(fig, path)
