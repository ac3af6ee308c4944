"""`fedflock report`: figures and report.md from real (seconds-long) run and compare directories.

The runs are made once per module; tests that add or change files work on copies, so the set
of files each test sees does not depend on test order.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import numpy as np
import pytest

from fedflock.compare import compare
from fedflock.errors import FedflockError
from fedflock.experiment import run_experiment
from fedflock.report import make_report
from fedflock.report.document import decided_by
from fedflock.report.load import load_compare
from fedflock.report.plots import (
    accuracy_series,
    fmt_number,
    leaf_purity,
    plot_compare_accuracy,
    split_order,
    tree_layout,
)
from fedflock.validation import validate
from tests.conftest import small_config

# Two hidden groups with swapped labels: CFL with no warm-up and a lowered pseudo-F threshold
# splits them within the first rounds for seeds 0 and 1 (asserted below, never assumed).
CFL_SPLITS = {
    "algorithm": {"name": "cfl", "warmup_rounds": 0, "patience": 1, "f_threshold": 2.5},
    "rounds": 5,
    "data.clients": 8,
    "data.scenario": {"kind": "label_swap", "groups": 2},
    "training.lr": 0.5,
    "checkpoint_every": 5,  # one checkpoint at the end: saving every round costs seconds
}


@pytest.fixture(scope="module")
def _env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Module fixtures run before conftest's per-test cache fixture: isolate them the same way."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDFLOCK_CACHE", str(tmp_path_factory.getbasetemp() / "fedflock-cache"))
        mp.setenv("FEDFLOCK_QUIET", "1")
        yield


@pytest.fixture(scope="module")
def cfl_run(_env: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cfl") / "run"
    summary = run_experiment(validate(small_config(**CFL_SPLITS)), out, quiet=True)
    assert summary["splits"], "the test config must make CFL split"
    return out


@pytest.fixture(scope="module")
def compare_dir(_env: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compare") / "cmp"
    compare(validate(small_config(**CFL_SPLITS)), ["cfl", "fedavg"], [0, 1], out, quiet=True)
    return out


@pytest.fixture(scope="module")
def cfl_report(cfl_run: Path) -> list[Path]:
    """The report of the CFL run, made once for the tests that only read it."""
    return make_report(cfl_run)


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("report"))
    return dst


def _summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def assert_figure(path: Path) -> None:
    """A real PNG figure: decodes, is larger than a thumbnail, and is not one flat colour."""
    assert path.is_file(), path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    image = mpimg.imread(path)
    height, width = image.shape[:2]
    assert width > 200 and height > 200, f"{path.name}: {width}x{height}"
    rgb = image[..., :3]
    assert float(rgb.std()) > 0.02, f"{path.name} is (nearly) a single flat colour"
    packed = (np.round(rgb * 255).astype(np.uint32) * [65536, 256, 1]).sum(axis=-1)
    assert len(np.unique(packed)) > 20, f"{path.name}: too few colours"


def _links(report: Path) -> set[str]:
    return set(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report.read_text()))


def _check_written(written: list[Path], folder: Path) -> dict[str, Path]:
    """Every returned path exists in DIR/report; PNGs are valid and linked from report.md."""
    names = {p.name: p for p in written}
    assert len(names) == len(written), "a file was listed twice"
    assert all(p.parent == folder for p in written)
    assert "report.md" in names
    pngs = {n for n in names if n.endswith(".png")}
    for name in pngs:
        assert_figure(names[name])
    assert _links(names["report.md"]) == pngs
    assert {p.name for p in folder.glob("*.png")} == pngs
    return names


def test_figure_check_rejects_a_blank_image(tmp_path: Path) -> None:
    blank = tmp_path / "blank.png"
    mpimg.imsave(blank, np.ones((300, 400, 3)))
    with pytest.raises(AssertionError, match="flat colour"):
        assert_figure(blank)


def test_run_with_splits_gets_every_figure(cfl_run: Path, cfl_report: list[Path]) -> None:
    summary = _summary(cfl_run)
    names = _check_written(cfl_report, cfl_run / "report")
    heatmaps = {f"split_{i:02d}.png" for i in range(len(summary["splits"]))}
    assert set(names) == {"accuracy.png", "clusters.png", "norms.png", "tree.png", "report.md",
                          *heatmaps}
    text = names["report.md"].read_text()
    assert text.startswith("# Report: cfl on digits / label_swap (seed 0)")
    assert f"| {100 * summary['accuracy']['mean']:.1f} |" in text
    first = summary["splits"][0]
    row = f"| 1 | {first['round']} | split test | {first['parent']} → {first['children'][0]}, "
    assert row in text
    assert text.count("\n| ") >= 1 + len(summary["splits"])


def test_run_without_splits_skips_heatmaps_and_tree(compare_dir: Path, tmp_path: Path) -> None:
    run = _copy(compare_dir / "fedavg" / "seed0", tmp_path)
    assert not _summary(run)["splits"]
    written = make_report(run)
    names = _check_written(written, run / "report")
    assert set(names) == {"accuracy.png", "norms.png", "report.md"}
    assert "No splits" in names["report.md"].read_text()
    assert make_report(run) == written  # a second report overwrites the first


def test_missing_fields_and_unfinished_run(cfl_run: Path, tmp_path: Path) -> None:
    """Older rounds without accuracy or cluster records, no summary yet, a half-written line."""
    run = _copy(cfl_run, tmp_path)
    records = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    for rec in records[:2]:
        for key in ("accuracy_mean", "accuracy_worst", "accuracy", "clusters"):
            rec.pop(key)
    records[2]["clusters"][0].pop("pseudo_f", None)
    records[-1]["evaluated_round"] = records[-1]["round"] - 1  # its evaluation unanswered
    lines = [json.dumps(r) for r in records] + ['{"round": 99, "accura']
    (run / "metrics.jsonl").write_text("\n".join(lines))
    (run / "summary.json").unlink()  # both are written only when the run ends
    shutil.rmtree(run / "splits")
    names = _check_written(make_report(run), run / "report")
    assert set(names) == {"accuracy.png", "norms.png", "report.md"}
    text = names["report.md"].read_text()
    assert "not written yet" in text
    last = records[-1]["round"]
    assert f"last logged round {last} (figures of round {last - 1}, the last evaluated)" in text


def test_corrupt_metrics_line_is_one_clear_error(cfl_run: Path, tmp_path: Path) -> None:
    run = _copy(cfl_run, tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], "{oops", *lines[1:]]) + "\n")
    with pytest.raises(FedflockError, match="line 2 is not valid JSON"):
        make_report(run)


def test_compare_dir(compare_dir: Path, tmp_path: Path) -> None:
    cmp = _copy(compare_dir, tmp_path)
    cfl_summary = _summary(cmp / "cfl" / "seed0")
    assert cfl_summary["splits"], "cfl seed 0 must split for the per-algorithm figures"
    names = _check_written(make_report(cmp), cmp / "report")
    heatmaps = {f"cfl_split_{i:02d}.png" for i in range(len(cfl_summary["splits"]))}
    expected = {"accuracy.png", "cfl_accuracy.png", "cfl_clusters.png", "cfl_norms.png",
                "cfl_tree.png", *heatmaps}
    assert set(names) == {*expected, "report.md"}
    assert not any(n.startswith("fedavg_") for n in names)
    text = names["report.md"].read_text()
    assert (cmp / "compare.md").read_text() in text
    assert text.startswith("# Comparison: cfl, fedavg on digits / label_swap")


def test_compare_accuracy_uses_every_seed(compare_dir: Path, tmp_path: Path) -> None:
    """Without one seed's run the min-max band changes, so the figure must change too."""
    cmp = _copy(compare_dir, tmp_path)
    figure = tmp_path / "accuracy.png"
    plot_compare_accuracy(load_compare(cmp), figure)
    both = mpimg.imread(figure)
    shutil.rmtree(cmp / "cfl" / "seed1")
    plot_compare_accuracy(load_compare(cmp), figure)
    one = mpimg.imread(figure)
    assert one.shape != both.shape or not np.array_equal(one, both)


@pytest.mark.parametrize("kind", ["empty", "unrelated", "file", "missing"])
def test_not_a_run_or_compare_dir(kind: str, tmp_path: Path) -> None:
    target = tmp_path / "target"
    if kind == "file":
        target.write_text("x")
    elif kind != "missing":
        target.mkdir()
    if kind == "unrelated":
        (target / "notes.txt").write_text("hello")
        (target / "sub").mkdir()
    with pytest.raises(FedflockError) as err:
        make_report(target)
    assert "\n" not in str(err.value)
    assert str(target) in str(err.value)


def test_split_order_groups_parts_then_client_id() -> None:
    members = [7, 2, 5, 0]
    order, sizes = split_order(members, {"members": [[5, 2], [7, 0]]})
    assert [members[i] for i in order] == [2, 5, 0, 7]
    assert sizes == [2, 2]
    order, sizes = split_order(members, {"members": [[5], [7]]})  # inconsistent record
    assert [members[i] for i in order] == [0, 2, 5, 7] and sizes == [4]
    order, sizes = split_order(members, {"members": 4})  # a count, as older runs recorded
    assert [members[i] for i in order] == [0, 2, 5, 7] and sizes == [4]


@pytest.mark.parametrize(("split", "decided"), [
    ({"kind": "split", "rule": "recheck", "kway_f": 5.0}, "re-examination (split test)"),
    ({"kind": "split", "modularity": 0.4, "cross_ratio": 0.1}, "Louvain communities"),
    ({"kind": "split", "pseudo_f": 9.0}, "split test"),
    ({"kind": "cluster"}, "cluster"),
])
def test_each_recorded_decision_says_what_decided_it(split: dict, decided: str) -> None:
    assert decided_by(split) == decided


def test_tree_layout_and_purity() -> None:
    nodes = {0: {"parent": None, "children": [1, 2]}, 1: {"parent": 0, "children": [3, 4]},
             2: {"parent": 0, "children": []}, 3: {"parent": 1, "children": []},
             4: {"parent": 1, "children": []}}
    place = tree_layout(nodes)
    assert {n: d for n, (_, d) in place.items()} == {0: 0, 1: 1, 2: 1, 3: 2, 4: 2}
    assert place[3][0] < place[4][0] < place[2][0]
    assert place[1][0] == pytest.approx((place[3][0] + place[4][0]) / 2)
    assert leaf_purity([0, 1, 2], [1, 1, 0]) == (1, pytest.approx(2 / 3))
    assert leaf_purity([5], [0, 1]) is None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FEDFLOCK_QUIET": "1"}
    return subprocess.run([sys.executable, "-m", "fedflock", *args], capture_output=True,
                          text=True, env=env, timeout=120, check=False)


def test_cli_report(compare_dir: Path, tmp_path: Path) -> None:
    run = _copy(compare_dir / "fedavg" / "seed1", tmp_path)
    done = _cli("report", str(run))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote 3 files to {run / 'report'}"
    assert_figure(run / "report" / "accuracy.png")

    empty = tmp_path / "empty"
    empty.mkdir()
    done = _cli("report", str(empty))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr


def test_attack_runs_colour_clients_by_malice() -> None:
    from fedflock.report.load import RunData

    plain = RunData(Path("r"), summary={"true_groups": [0, 1, 0]})
    assert plain.reference_groups == ["true group 0", "true group 1", "true group 0"]
    attacked = RunData(Path("r"), summary={"true_groups": [0, 0, 0],
                                           "attack": {"malicious": [1]}})
    assert attacked.reference_groups == ["benign", "malicious", "benign"]
    grouped = RunData(Path("r"), summary={"true_groups": [0, 1], "attack": {"malicious": [0]}})
    assert grouped.reference_groups == ["true group 0, malicious", "true group 1, benign"]


@pytest.mark.parametrize(("value", "cell"), [
    (0.4212, "0.421"), (-0.003167, "-0.003"), (444825.654639, "444825.655"),
    (2.1114553424989884e16, "2.111e+16"), (-3.5e6, "-3.500e+06"), (float("inf"), "∞"),
    (None, "–"), (float("nan"), "–")])
def test_table_numbers_stay_short_when_a_model_diverges(value: float | None, cell: str) -> None:
    assert fmt_number(value) == cell


def test_a_round_that_repeats_earlier_figures_is_not_plotted_as_its_own() -> None:
    from fedflock.report.load import RunData

    run = RunData(Path("run"), metrics=[
        {"round": 1, "accuracy_mean": 0.5}, {"round": 2},
        {"round": 3, "accuracy_mean": 0.5, "evaluated_round": 1},
        {"round": 4, "accuracy_mean": 0.75}])
    assert accuracy_series(run) == {1: 50.0, 4: 75.0}


def test_cluster_curves_follow_the_final_clusters_back_through_every_round(
        tmp_path: Path) -> None:
    """Each final cluster's members averaged per evaluated round; a repeated round, a client
    without a figure and a run of one cluster add no curve point, figure or cluster."""
    from fedflock.report.load import RunData
    from fedflock.report.plots import cluster_curves, plot_cluster_curves

    summary = {"primary_metric": "perplexity", "clusters": [[0, 2], [1]]}
    run = RunData(Path("run"), summary=summary, metrics=[
        {"round": 1, "perplexity": [40.0, 50.0, 60.0]},
        {"round": 2, "perplexity": [40.0, 50.0, 60.0], "evaluated_round": 1},
        {"round": 3, "perplexity": [20.0, 45.0, None]}])
    assert cluster_curves(run) == {0: {1: 50.0, 3: 20.0}, 1: {1: 50.0, 3: 45.0}}
    assert_figure(plot_cluster_curves(run, tmp_path / "clusters.png"))
    one = RunData(Path("run"), summary={**summary, "clusters": [[0, 1, 2]]}, metrics=run.metrics)
    assert cluster_curves(one) == {} and plot_cluster_curves(one, tmp_path / "x.png") is None
