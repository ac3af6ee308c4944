"""The windowed split test's parameters, shared by the methods that keep examining their
clusters on their members' updates (CFL, incremental clustering): what a window holds
(`clustering.watch`), how it is scored and how a cluster that fails it is split."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from fedflock.algorithms.base import AlgorithmParams
from fedflock.clustering.split_stats import SCORE_FIGURE, SplitInto, SplitStatistic
from fedflock.clustering.watch import WindowRule


class SplitTestParams(AlgorithmParams):
    field_groups: ClassVar[dict[str, tuple[str, ...]]] = {
        "split test": ("split_statistic", "split_into", "f_threshold", "patience",
                       "min_cluster_size"),
        "windows under partial participation": ("window_coverage", "same_round_share",
                                                "stable_tol"),
    }

    split_statistic: SplitStatistic = Field(
        "kway", description="what a window scores: kway, the pseudo-F of the best cut of the "
        "min-max merge tree into 2 to n/2 parts; bipartition, of its cut in two (finds at most "
        "two groups per split)")
    split_into: SplitInto = Field(
        "cut", description="how a cluster splits: cut, into the parts the statistic scored; "
        "two, the min-max bipartition (the CFL paper's recursive splits: slower, one level per "
        "patience windows)")
    f_threshold: float = Field(3.5, gt=1.0, description="pseudo-F a window must exceed to "
                               "count toward a split (about 1 for updates without groups); "
                               "lower it to split weaker groups, at the risk of over-splits")
    patience: int = Field(3, ge=1, description="windows in a row above f_threshold before a "
                          "split; also the rounds over which a model's change is judged "
                          "settled (stable_tol)")
    stable_tol: float = Field(0.1, gt=0, lt=1, description="a window may span rounds once "
                              "the cluster model's relative change shrank by less than this "
                              "over patience rounds")
    window_coverage: float = Field(0.5, ge=0, le=1, description="share of a cluster's "
                                   "members whose updates a window needs (under full "
                                   "participation every round is a window)")
    same_round_share: float | None = Field(
        0.5, gt=0, le=1, description="before a cluster's model has settled, one round's "
        "replies form a window when they number this share of what a window needs (they share "
        "one model, so they differ by data, not age); null: full windows only")
    min_cluster_size: int = Field(3, ge=2, description="smallest cluster examined")

    def window_rule(self, min_size: int) -> WindowRule:
        """When a window closes, for windows of at least `min_size` updates."""
        return WindowRule(self.patience, self.stable_tol, self.window_coverage, min_size,
                          self.same_round_share)

    def thresholds(self) -> list[dict[str, Any]]:
        """The threshold a report draws on the split statistic's curve."""
        return [{"statistic": SCORE_FIGURE[self.split_statistic], "value": self.f_threshold,
                 "label": "split threshold"}]
