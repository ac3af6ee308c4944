"""Plots and a markdown report of a run or a compare directory."""

from fedflock.report.document import make_report

__all__ = ["make_report"]
