"""The "write your own method" page's code, run as a user would: saved as a plugin file and
loaded. Its `partition` only returns the parts, and its split is recorded like the built-in
methods': in the summary's splits and tree, and in the report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedflock.experiment import run_experiment
from fedflock.plugins import load_plugins
from fedflock.report import make_report
from fedflock.validation import validate
from tests.conftest import small_config

PAGE = Path(__file__).resolve().parents[1] / "docs" / "own-method.md"


def page_code() -> str:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) == 1, "the page shows one complete method"
    return blocks[0]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_pages_method_runs_and_its_split_is_in_the_summary_the_tree_and_the_report(
        tmp_path: Path) -> None:
    plugin = tmp_path / "one_shot.py"
    plugin.write_text(page_code())
    load_plugins([str(plugin)])
    raw = small_config(rounds=5, algorithm={"name": "one_shot"})
    summary = run_experiment(validate(raw), tmp_path / "run", quiet=True)
    assert summary["num_clusters"] == 2
    [split] = summary["splits"]
    assert split["kind"] == "split" and split["round"] == 3 and split["parent"] == 0
    assert split["children"] == [1, 2] and sum(split["sizes"]) == 6
    tree = {node["id"]: node for node in summary["tree"]}
    assert tree[0]["children"] == [1, 2] and tree[0]["split_round"] == 3
    assert sorted(tree[1]["members"] + tree[2]["members"]) == list(range(6))
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["splits"] == [split]
    assert make_report(tmp_path / "run")
    report = (tmp_path / "run" / "report" / "report.md").read_text()
    assert "| 1 | 3 | split | 0 → 1, 2 |" in report
    assert (tmp_path / "run" / "report" / "tree.png").exists()
