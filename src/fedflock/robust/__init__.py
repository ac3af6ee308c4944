"""Attacks (model poisoning by malicious clients) and the robust aggregation rules defending
against them. Who is malicious, and data poisoning, live with the data
(`fedflock.data.poisoning`)."""

from fedflock.robust.aggregators import coordinate_median, krum_scores, multi_krum, trimmed_mean
from fedflock.robust.attacks import POISONINGS, Adversary

__all__ = [
    "POISONINGS",
    "Adversary",
    "coordinate_median",
    "krum_scores",
    "multi_krum",
    "trimmed_mean",
]
