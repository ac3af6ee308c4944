"""Clustering primitives: bipartition, split statistics, the parameter tree."""

from fedflock.clustering.bipartition import bipartition, minmax_bipartition_reference
from fedflock.clustering.split_stats import SplitStats, split_stats
from fedflock.clustering.tree import ParameterTree

__all__ = [
    "ParameterTree",
    "SplitStats",
    "bipartition",
    "minmax_bipartition_reference",
    "split_stats",
]
