"""Attacks (model poisoning by malicious clients) and the robust aggregation rules defending
against them. Who is malicious, and data poisoning, live with the data
(`fedflock.data.poisoning`)."""

from fedflock.robust.aggregators import coordinate_median, krum_scores, multi_krum, trimmed_mean
from fedflock.robust.attacks import POISONINGS, Adversary
from fedflock.robust.credit import count_sketch, credit, reconstruction_errors
from fedflock.robust.gra import gra, kmeans_groups, weighted_median
from fedflock.robust.irls import irls, repeated_median_line

__all__ = [
    "POISONINGS",
    "Adversary",
    "coordinate_median",
    "count_sketch",
    "credit",
    "gra",
    "irls",
    "kmeans_groups",
    "krum_scores",
    "multi_krum",
    "reconstruction_errors",
    "repeated_median_line",
    "trimmed_mean",
    "weighted_median",
]
