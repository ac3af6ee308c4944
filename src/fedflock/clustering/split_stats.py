"""The statistics CFL looks at before splitting a cluster (all from the cosine matrix + norms).

- `alpha_intra_min`, `alpha_cross_max`, `gap`: the separation of the proposed bipartition
  (the paper: a correct split has alpha_cross_max < alpha_intra_min).
- `gamma_max` and `gamma_bound = sqrt((1 - alpha_cross_max) / 2)`: the paper's guarantee that
  the split separates incongruent clients holds when gamma_max < gamma_bound.
- `pseudo_f`: the Calinski-Harabasz ratio of the bipartition computed on unit-normalised updates
  from the cosine matrix alone. It is scale-free: about 1 for structureless updates whatever
  their norms, large when the two parts point in different directions.
- `kway_f` (at `kway_k` parts): the largest Calinski-Harabasz ratio over the cuts of the same
  merge tree into k = 2, 3, ... parts. The bipartition's ratio loses its power when one window
  mixes many groups: n noise-free unit updates spread evenly over K orthogonal directions give
  it exactly (n - 2) / (K - 2) (1.0 for 8 updates of 8 groups), while the cut into the K
  groups has no within-part scatter at all. For structureless updates every cut scores about 1
  (between and within scatter per degree of freedom are the same), so the threshold keeps its
  meaning. k stops at n / 2 (`max_parts`): the within-part scatter then has at least as many
  degrees of freedom (n - k) as there are parts. Near n parts it would rest on the few closest
  pairs, selected from the noise, and the ratio inflates: a feature-skew window of 32 updates
  scored 3.6 at k = 29 (28 singletons) and split into them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from fedflock.clustering.bipartition import Linkage, merge_tree

SplitStatistic = Literal["kway", "bipartition"]
SplitInto = Literal["two", "cut"]
SCORE_FIGURE = {"kway": "kway_f", "bipartition": "pseudo_f"}  # the figure each one decides by


def max_parts(n: int) -> int:
    """The most parts `kway_pseudo_f` scores a cut of n items into."""
    return max(2, n // 2)


@dataclass
class SplitStats:
    parts: tuple[list[int], list[int]]  # positions into the rows given
    alpha_intra_min: float
    alpha_cross_max: float
    gap: float
    gamma_max: float
    gamma_bound: float
    pseudo_f: float
    mean_norm: float
    max_norm: float
    kway_f: float
    kway_k: int
    kway_parts: list[list[int]]  # the cut that scored kway_f (positions into the rows given)

    def figures(self) -> dict[str, float]:
        """The JSON figures of a decision (alpha, gap and gamma describe the bipartition)."""
        out = asdict(self)
        out.pop("parts")
        out.pop("kway_parts")
        return {k: v if isinstance(v, int) else round(float(v), 6) for k, v in out.items()}

    def score(self, statistic: SplitStatistic) -> float:
        """The figure a split decision compares with its threshold."""
        return float(getattr(self, SCORE_FIGURE[statistic]))

    def split(self, statistic: SplitStatistic, into: SplitInto) -> list[list[int]]:
        """The parts a split makes: the cut `statistic` scored, or the min-max bipartition."""
        if into == "cut" and statistic == "kway":
            return self.kway_parts
        return list(self.parts)


def pseudo_f(similarity: np.ndarray, parts: tuple[list[int], list[int]]) -> float:
    n = len(similarity)
    if n <= 2:
        return 0.0
    diag = np.diag(similarity)  # 1 for unit updates, 0 for a zero one
    total = diag.sum() - similarity.sum() / n
    within = sum(diag[p].sum() - similarity[np.ix_(p, p)].sum() / len(p) for p in parts)
    between = total - within
    if total <= 1e-12:
        return 0.0  # no scatter at all: identical updates hold no groups
    if within <= 1e-12:
        return math.inf
    return float(between / (within / (n - 2)))


def kway_pseudo_f(similarity: np.ndarray, linkage: Linkage = "single") -> tuple[float, int]:
    """(largest pseudo-F, its number of parts) over the cuts of the merge tree into k parts,
    2 <= k <= `max_parts(n)`. O(n^2) from the tree."""
    sim = np.asarray(similarity, dtype=np.float64)
    return _best_cut(sim, merge_tree(sim, linkage)) if len(sim) > 2 else (0.0, 2)


def cut_parts(tree: np.ndarray, k: int) -> list[list[int]]:
    """The k parts left after the first n - k merges of a SciPy linkage matrix (ordered by
    their smallest item). Replayed here rather than `fcluster(tree, k, "maxclust")`, which
    cuts at a distance and so returns fewer than k parts when merge distances tie."""
    n = len(tree) + 1
    members: list[list[int]] = [[i] for i in range(n)]
    alive = set(range(n))
    for a, b, _, _ in tree[: n - k]:
        a, b = int(a), int(b)
        members.append(members[a] + members[b])
        alive -= {a, b}
        alive.add(len(members) - 1)
    return sorted((sorted(members[i]) for i in alive), key=lambda p: p[0])


def _best_cut(sim: np.ndarray, tree: np.ndarray) -> tuple[float, int]:
    sim = (sim + sim.T) / 2.0
    n = len(sim)
    if n <= 2:
        return 0.0, 2
    members: list[list[int]] = [[i] for i in range(n)]
    sums = list(np.diag(sim))  # sum of the similarity block of each tree node
    traces = list(np.diag(sim))  # squared norms in the node (1 each for unit vectors)
    scatter = [0.0] * n  # within-node scatter: trace - block sum / size
    added = np.empty(n - 1)  # within scatter each merge adds
    for t, (a, b, _, _) in enumerate(tree):
        a, b = int(a), int(b)
        merged = members[a] + members[b]
        block = sums[a] + sums[b] + 2.0 * sim[np.ix_(members[a], members[b])].sum()
        members.append(merged)
        sums.append(block)
        traces.append(traces[a] + traces[b])
        scatter.append(traces[-1] - block / len(merged))
        added[t] = scatter[-1] - scatter[a] - scatter[b]
    total = scatter[-1]
    if total <= 1e-12:
        return 0.0, 2  # no scatter at all: identical updates hold no groups
    # k parts remain after n - k merges: their within scatter is the sum of the first n - k adds
    k = np.arange(2, max_parts(n) + 1)
    within = np.cumsum(added)[n - k - 1]
    empty = within <= 1e-12
    if empty.any():  # parts without scatter: the fewest such parts, at infinite ratio
        return math.inf, int(k[empty.argmax()])
    value = ((total - within) / (k - 1)) / (within / (n - k))
    best = int(value.argmax())
    return (float(value[best]), int(k[best])) if value[best] > 0 else (0.0, 2)


def split_stats(gram: np.ndarray, weights: np.ndarray, similarity: np.ndarray,
                linkage: Linkage = "single") -> SplitStats:
    """Statistics of the best bipartition of one cluster, from the Gram matrix of its updates
    (rows in the same order as `similarity`) and the clients' example counts."""
    gram = np.asarray(gram, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    tree = merge_tree(similarity, linkage)
    a, b = cut_parts(tree, 2)  # the min-max bipartition (`bipartition`'s cut)
    parts = (a, b)
    intra = np.concatenate(
        [similarity[np.ix_(p, p)][~np.eye(len(p), dtype=bool)] for p in parts]
    )
    sq_norms = np.clip(np.diag(gram), 0.0, None)
    gamma = np.zeros(len(gram))
    for p in parts:
        # ||u_i - m||^2 with m the weighted mean of part p, expanded through the Gram matrix.
        wp = w[p] / w[p].sum()
        cross = gram[np.ix_(p, p)] @ wp
        mean_sq = wp @ gram[np.ix_(p, p)] @ wp
        dist = np.clip(sq_norms[p] - 2 * cross + mean_sq, 0.0, None)
        gamma[p] = np.sqrt(dist) / np.maximum(np.sqrt(sq_norms[p]), 1e-300)
    alpha_cross_max = float(similarity[np.ix_(a, b)].max())
    alpha_intra_min = float(intra.min()) if intra.size else 1.0
    wn = w / w.sum()
    kway_f, kway_k = _best_cut(np.asarray(similarity, dtype=np.float64), tree)
    return SplitStats(
        parts=parts,
        alpha_intra_min=alpha_intra_min,
        alpha_cross_max=alpha_cross_max,
        gap=alpha_intra_min - alpha_cross_max,
        gamma_max=float(gamma.max()),
        gamma_bound=math.sqrt(max(0.0, (1.0 - alpha_cross_max) / 2.0)),
        pseudo_f=pseudo_f(similarity, parts),
        mean_norm=float(np.sqrt(max(wn @ gram @ wn, 0.0))),
        max_norm=float(np.sqrt(sq_norms.max())),
        kway_f=kway_f,
        kway_k=kway_k,
        kway_parts=cut_parts(tree, kway_k),
    )
