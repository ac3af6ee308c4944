"""The timing benchmarks hook into the engine's private steps (`Run._round`, `Run._checkpoint`):
they must still run and write the rows their published tables render."""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks import executors


def test_the_executors_benchmark_times_real_rounds_and_writes_its_rows(tmp_path: Path) -> None:
    rows_path = tmp_path / "rows.jsonl"
    executors.main(["--clients", "4", "--executors", "sequential,processes", "--rounds", "2",
                    "--budget", "5", "--samples", "40", "--out", str(tmp_path / "runs"),
                    "--rows", str(rows_path)])
    (row,) = [json.loads(line) for line in rows_path.read_text().splitlines()]
    assert row["clients"] == 4 and row["fastest"] in ("sequential", "processes")
    for executor in ("sequential", "processes"):
        assert row[f"{executor}_seconds"] > 0 and not math.isnan(row[f"{executor}_seconds"])
        assert 0 <= row[f"{executor}_outside"] <= 100
    assert row["machine"]["cores"] >= 1
