"""The published-tables pipeline: a table's quick variant runs from scratch and renders into
its page, and a page that differs from its committed rows fails the check, naming the page."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks import reproduce, tables

TABLE = reproduce.TABLES["four-groups-digits"]


def _copy_docs(tmp_path: Path) -> Path:
    """docs/ and README.md (the headline and the figure are rendered into it) beside it."""
    docs = tmp_path / "docs"
    shutil.copytree(reproduce.DOCS, docs)
    shutil.copy(reproduce.ROOT / "README.md", tmp_path / "README.md")
    return docs


def test_the_committed_pages_are_their_tables_renderings() -> None:
    assert reproduce.render(reproduce.RESULTS, reproduce.DOCS, check=True) == []


def test_a_changed_number_in_the_rows_fails_the_check_naming_the_page(tmp_path: Path) -> None:
    results, docs = tmp_path / "results", _copy_docs(tmp_path)
    shutil.copytree(reproduce.RESULTS, results)
    path = TABLE.rows_files(results)[0]
    rows = tables.read_rows(path)
    rows[0]["final"] = round(rows[0]["final"] - 0.05, 6)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = (docs / TABLE.page).read_text()
    assert reproduce.render(results, docs, check=True) == [
        f"{TABLE.page}: table '{TABLE.name}' differs from its rendering"]
    assert (docs / TABLE.page).read_text() == before  # a check writes nothing
    reproduce.render(results, docs, check=False)  # rendered again: the check passes
    assert (docs / TABLE.page).read_text() != before
    assert reproduce.render(results, docs, check=True) == []


def test_the_quick_variant_runs_from_scratch_and_renders_into_its_page(tmp_path: Path) -> None:
    results, docs = tmp_path / "results", _copy_docs(tmp_path)
    path = TABLE.run(quick=True, results=results, out=tmp_path / "runs")
    rows = tables.read_rows(path)
    assert len(rows) == len(TABLE.runs(quick=True)) and {r["rounds"] for r in rows} == {
        tables.QUICK_ROUNDS}
    assert all(0 <= r["final"] <= 1 and r["best"] is not None for r in rows)
    reproduce.render(results, docs, check=False)
    page = (docs / TABLE.page).read_text()
    assert "| `digits_iid` | fedavg | 0 |" in page
    assert "benchmarks.reproduce run four-groups-digits" in page


def test_an_attacked_table_records_benign_accuracy_and_attack_success(tmp_path: Path) -> None:
    table = tables.ConfigTable("attacked", "x.md", (
        tables.Experiment("digits_iid.yaml", ("fedavg", "median"), quick=True,
                          overrides=("attack={kind: label_flip, fraction: 0.3}",),
                          label="flip-30%"),
        tables.Experiment("digits_iid.yaml", ("fedavg",), quick=True,
                          overrides=("attack=null",), label="no-attack"),
    ), columns=("benign", "benign_best", "asr", "clusters"), isolated=True)
    rows = tables.read_rows(table.run(quick=True, results=tmp_path, out=tmp_path / "runs"))
    attacked = [r for r in rows if r["config"] == "flip-30%"]
    assert [r["algorithm"] for r in attacked] == ["fedavg", "median"]
    assert all(0 <= r["asr"] <= 1 and 0 < r["benign"] <= r["benign_best"] + 1e-5
               for r in attacked)
    clean = next(r for r in rows if r["config"] == "no-attack")
    assert clean["benign"] == clean["final"] and clean.get("asr") is None
    assert all(r["peak_rss"] > 2**20 for r in rows)  # its own process's, in bytes
    text = table.render(tmp_path)
    assert "| `flip-30%` | median | 0 |" in text and "| `no-attack` | fedavg | 0 |" in text
    assert "attack success %" in text and text.count("\n| `") == 3


def _grid_row(cell: str, scenario: str, algorithm: str, seed: int, accuracy: float,
              ari: float, clusters: int = 1) -> dict:
    return {"cell": cell, "scenario": scenario, "algorithm": algorithm, "seed": seed,
            "accuracy": accuracy, "ari": ari, "clusters": clusters}


def test_the_grid_table_counts_paying_cells_both_yardsticks_and_control_splits(
        tmp_path: Path) -> None:
    rows = []
    for cell, scenario, fedavg, oracle, found in [
            ("perm", "label_permutation", 0.3, 0.9, (1.0, 4)),   # pays, found
            ("rot", "rotation", 0.8, 0.9, (0.5, 2)),             # pays, missed
            ("skew", "feature_skew", 0.7, 0.8, (0.3, 2)),        # pays, right on {invert, rest}
            ("flat", "label_swap", 0.9, 0.92, (0.0, 1)),         # gains < 5 points: not counted
            ("iid", "iid", 0.9, 0.9, (1.0, 2)),                  # a control that split
            ("writers", "natural", 0.6, 0.6, (1.0, 1))]:
        rows += [_grid_row(cell, scenario, "fedavg", 0, fedavg, 0.0),
                 _grid_row(cell, scenario, "oracle", 0, oracle, 1.0),
                 _grid_row(cell, scenario, "cfl", 0, 0.8, found[0], found[1])]
    table = tables.GridTable("grid", "x.md", seeds=(0,), methods=("cfl",))
    rows_path, coarse_path = table.rows_files(tmp_path)
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    coarse_path.write_text(json.dumps({"cell": "skew", "seed": 0, "cfl": {"ari_coarse": 1.0}})
                           + "\n")
    assert "| 0 | cfl | 3 | 1 (33.3%) | 2 (66.7%) | 1 of 1 | 0 of 1 |" in table.render(tmp_path)


def test_the_readme_headline_and_figure_follow_the_rows_they_read(tmp_path: Path) -> None:
    results, docs = tmp_path / "results", _copy_docs(tmp_path)
    shutil.copytree(reproduce.RESULTS, results)
    mnist = results / "four-groups-mnist.jsonl"
    rows = tables.read_rows(mnist)
    for row in rows:
        if row["algorithm"] == "fedavg" and row["config"] == "mnist_label_permutation":
            row["final"] = 0.5
    mnist.write_text("".join(json.dumps(r) + "\n" for r in rows))
    grid = results / "scenario-grid.jsonl"
    grid.write_text("".join(json.dumps(r | {"accuracy": 0.5}) + "\n"
                            for r in tables.read_rows(grid)))
    assert sorted(reproduce.render(results, docs, check=True)) == [
        "../README.md: table 'headline' differs from its rendering",
        "assets/scenario-grid.png: figure 'grid-figure' differs from its drawing",
        "results/index.md: table 'four-groups-mnist' differs from its rendering",
        "results/scenario-grid.md: table 'scenario-grid' differs from its rendering"]
    reproduce.render(results, docs, check=False)
    assert "against fedavg 50.0 ± 0.0 |" in (tmp_path / "README.md").read_text()
    assert reproduce.render(results, docs, check=True) == []


def test_a_sweep_table_has_a_line_per_setting_and_a_column_per_scenario(tmp_path: Path) -> None:
    table = tables.SweepTable("sweep", "x.md", tuple(
        tables.Experiment("digits_iid.yaml", ("cfl",), overrides=(setting,),
                          label=f"{setting} · {scenario}")
        for setting in ("a=1", "a=2") for scenario in ("one", "two")), seeds=(0, 1),
        defaults=("a=1",))
    rows = [{"config": f"{setting} · {scenario}", "algorithm": "cfl", "seed": seed,
             "rounds": 5, "ari": ari, "clusters": k}
            for setting, scenario, ari, k in [("a=1", "one", 1.0, 4), ("a=1", "two", 0.5, 2),
                                              ("a=2", "one", 0.0, 1)] for seed in (0, 1)]
    (tmp_path / "sweep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = table.render(tmp_path).splitlines()
    assert lines[:4] == ["| setting | one | two |", "|---|---|---|",
                         "| `a=1` * | 1.00 / 4.0 | 0.50 / 2.0 |", "| `a=2` | 0.00 / 1.0 | – |"]


def test_a_course_appendix_averages_each_round_over_seeds() -> None:
    rows = [{"algorithm": "incremental", "course": [{"round": 10, "ari": a, "unplaced": u},
                                                    {"round": 20, "ari": 1.0}]}
            for a, u in ((0.5, 10), (1.0, 20))] + [
        {"algorithm": "cfl", "course": [{"round": 10, "ari": 0.0}]}]
    text = tables.course_table("incremental", {"ARI": "ari", "waiting": "unplaced"})(rows)
    assert text.splitlines() == ["| round | 10 | 20 |", "|---|---|---|",
                                 "| ARI (incremental) | 0.75 | 1.00 |",
                                 "| waiting (incremental) | 15 | – |"]


def test_runs_in_parallel_processes_give_the_rows_of_one_at_a_time(tmp_path: Path) -> None:
    table = tables.ConfigTable("dp", "x.md", (
        tables.Experiment("digits_iid.yaml", ("fedavg", "cfl"), overrides=(
            "rounds=3", "privacy.dp={mechanism: client, epsilon: 8, clip: 0.5}")),
    ), seeds=(0,), columns=reproduce.DP_COLUMNS)
    parallel = tables.read_rows(table.run(False, tmp_path / "two", tmp_path / "runs", jobs=2))
    serial = tables.read_rows(table.run(False, tmp_path / "one", tmp_path / "runs1"))
    assert len(parallel) == 2
    assert ({(r["algorithm"], r["final"], r["sigma"]) for r in parallel}
            == {(r["algorithm"], r["final"], r["sigma"]) for r in serial})
    assert all(r["sigma"] > 0 and 0 < r["epsilon"] <= 8 + 1e-6 for r in parallel)
    text = table.render(tmp_path / "two")
    assert "| σ | whole-run ε |" in text and text.count("\n| `digits_iid` |") == 2


def test_a_timing_table_renders_the_rows_its_script_wrote_with_the_machine(
        tmp_path: Path) -> None:
    table = tables.TimingTable("cost", "x.md", "distfl_synthesis_cost", (
        ("model", "`{model}`"), ("z", "{z}"), ("synthesis s", "{synthesis_seconds:.1f}")),
        args=("--models", "cnn_bn:digits", "--z", "4,8", "--importance", "0.5", "--steps", "2",
              "--clients", "2"))
    path = table.run(False, tmp_path / "results", tmp_path / "runs")
    rows = tables.read_rows(path)
    assert [r["z"] for r in rows] == [4, 8] and all(r["synthesis_seconds"] > 0 for r in rows)
    table.run(False, tmp_path / "results", tmp_path / "runs")  # a rerun replaces, not appends
    assert len(tables.read_rows(path)) == 2
    text = table.render(tmp_path / "results")
    assert text.count("\n| `cnn_bn` | ") == 2 and "torch threads" in text
    assert "python -m benchmarks.distfl_synthesis_cost --models cnn_bn:digits" in text


def test_a_stopped_table_reads_finished_runs_back_and_resumes_checkpointed_ones(
        tmp_path: Path) -> None:
    table = tables.ConfigTable("stopped", "x.md", (
        tables.Experiment("digits_iid.yaml", ("fedavg",), overrides=("rounds=2",)),), seeds=(0,))
    rows = tables.read_rows(table.run(False, tmp_path / "results", tmp_path / "runs"))
    where = tmp_path / "runs" / "stopped" / "digits_iid" / "fedavg" / "seed0"
    metrics = (where / "metrics.jsonl").stat().st_mtime_ns
    (tmp_path / "results" / "stopped.jsonl").unlink()  # stopped before its row was appended
    again = tables.read_rows(table.run(False, tmp_path / "results", tmp_path / "runs"))
    assert (where / "metrics.jsonl").stat().st_mtime_ns == metrics  # read back, not re-run
    assert again[0]["final"] == rows[0]["final"] and again[0]["peak_rss"] is None
    (tmp_path / "results" / "stopped.jsonl").unlink()
    (where / "summary.json").unlink()  # stopped after its last checkpoint
    resumed = tables.read_rows(table.run(False, tmp_path / "results", tmp_path / "runs"))
    assert resumed[0]["final"] == rows[0]["final"] and (where / "summary.json").is_file()


def test_newcomers_join_the_trained_run_and_their_placement_is_a_column(tmp_path: Path) -> None:
    table = tables.ConfigTable("joined", "x.md", (
        tables.Experiment("digits_label_permutation.yaml", ("pacfl",), overrides=("rounds=2",),
                          newcomers=4),), seeds=(0,), columns=("final", "newcomers"))
    row = tables.read_rows(table.run(False, tmp_path / "results", tmp_path / "runs"))[0]
    joined = row["newcomers"]
    assert 0 <= joined["placed"] <= 1 and 0 <= joined["final"] <= 1
    text = table.render(tmp_path / "results")
    assert "newcomers: in their group's cluster % / ARI / accuracy %" in text
    assert f"{joined['placed']:.0%} / {joined['ari']:.2f} / {100 * joined['final']:.1f}" in text


def test_a_papers_figures_stand_beside_our_means_and_a_missing_line_is_a_dash(
        tmp_path: Path) -> None:
    rows = [{"config": "shift, dual", "algorithm": "m", "seed": s, "final": f}
            for s, f in ((0, 0.5), (1, 0.7))]
    (tmp_path / "ours.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    view = tables.BesidePaper("cmp", "x.md", (("M", "m", ", dual"), ("N", "n", "")), (
        tables.Reported("theirs", "mine", "ours", "shift", {"M": 61.25}),))
    text = view.render(tmp_path)
    assert "| method | paper: theirs | ours: mine |" in text
    assert "| M | 61.25 | 60.0 ± 14.1 |" in text and "| N | – | – |" in text


def test_a_text_table_shows_perplexity_its_lowest_round_and_ratios_to_reference_lines(
        shared_data: Path, tmp_path: Path) -> None:
    """Lower is better for perplexity: the best round is the lowest, and each line's final
    figure is divided seed by seed by the reference lines'."""
    tiny = ("rounds=3", "eval_every=1", "data.clients=4", "data.samples_per_client=12",
            "data.test_per_client=6", "data.scenario={kind: topics, groups: 2}",
            "data.text={vocab_size: 200, seq_len: 8}", f"data.root={shared_data}",
            "model={name: lstm_lm, embedding: 8, hidden: [8], layers: 1}",
            "training.executor=sequential")
    table = tables.ConfigTable("text", "x.md", (
        tables.Experiment("agnews_topics.yaml", ("fedavg", "oracle"), overrides=tiny,
                          label="tiny"),), seeds=(0,),
        columns=("perplexity", "perplexity_best", "next_token_accuracy", "nmi"),
        against=(("tiny", "fedavg"),))
    rows = {r["algorithm"]: r for r in tables.read_rows(table.run(False, tmp_path / "results",
                                                                  tmp_path / "runs"))}
    fedavg, oracle = rows["fedavg"], rows["oracle"]
    curve = [c["perplexity_mean"] for c in fedavg["course"]]
    assert fedavg["best"] == min(curve) < curve[0]
    assert oracle["nmi"] == 1.0 and fedavg["nmi"] == 0.0
    assert 0 < fedavg["secondary"]["accuracy"] < 1
    text = table.render(tmp_path / "results")
    assert "final perplexity" in text and "÷ fedavg" in text
    ratio = oracle["final"] / fedavg["final"]
    assert f"| `tiny` | oracle | 0 | **{oracle['final']:.1f}** | {oracle['best']:.1f} | " in text
    assert text.splitlines()[3].endswith(f"| {ratio:.2f} |")
    assert text.splitlines()[2].endswith("| 1.00 |")
