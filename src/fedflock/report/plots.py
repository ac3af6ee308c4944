"""Placeholder replaced by the report module (see issue 2)."""

from pathlib import Path


def make_report(path: Path) -> list[Path]:
    raise NotImplementedError
