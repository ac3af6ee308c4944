"""The published-tables pipeline: a table's quick variant runs from scratch and renders into
its page, and a page that differs from its committed rows fails the check, naming the page."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks import reproduce

TABLE = reproduce.TABLES["four-groups-digits"]


def _copy_docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    shutil.copytree(reproduce.DOCS, docs)
    return docs


def test_the_committed_pages_are_their_tables_renderings() -> None:
    assert reproduce.render(reproduce.RESULTS, reproduce.DOCS, check=True) == []


def test_a_changed_number_in_the_rows_fails_the_check_naming_the_page(tmp_path: Path) -> None:
    results, docs = tmp_path / "results", _copy_docs(tmp_path)
    shutil.copytree(reproduce.RESULTS, results)
    path = reproduce.results_file(TABLE.name, results)
    rows = reproduce.read_rows(path)
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
    path = reproduce.run_table(TABLE, quick=True, results=results, out=tmp_path / "runs")
    rows = reproduce.read_rows(path)
    assert len(rows) == len(TABLE.runs(quick=True)) and {r["rounds"] for r in rows} == {
        reproduce.QUICK_ROUNDS}
    assert all(0 <= r["final"] <= 1 and r["best"] is not None for r in rows)
    reproduce.render(results, docs, check=False)
    page = (docs / TABLE.page).read_text()
    assert "| `digits_iid` | fedavg | 0 |" in page
    assert "benchmarks.reproduce run four-groups-digits" in page
