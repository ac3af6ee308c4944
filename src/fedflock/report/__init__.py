"""Plots and a markdown report of a run or a compare directory."""

from fedflock.report.plots import make_report

__all__ = ["make_report"]
