"""Attacks (malicious clients) and the robust aggregation rules defending against them."""

from fedflock.robust.aggregators import coordinate_median, krum_scores, multi_krum, trimmed_mean
from fedflock.robust.attacks import POISONINGS, Adversary
from fedflock.robust.malicious import check_label_map, flip_labels, malicious_clients

__all__ = [
    "POISONINGS",
    "Adversary",
    "check_label_map",
    "coordinate_median",
    "flip_labels",
    "krum_scores",
    "malicious_clients",
    "multi_krum",
    "trimmed_mean",
]
