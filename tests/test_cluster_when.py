"""When incremental clustering clusters (`cluster_when`): once the split test finds groups in
the global model's updates, not once FedAvg looks settled; the paper's rule when the test is
blind (a single reply every round)."""

from __future__ import annotations

import torch

from fedflock.report.document import decided_by
from tests.conftest import make_algorithm, update_reply
from tests.test_algorithm_contract import _through_a_checkpoint_file

SIZE = 50
GROUP_A, GROUP_B = torch.eye(SIZE)[0], torch.eye(SIZE)[1]


def _round(alg, rnd: int, clients: list[int], gen: torch.Generator, groups: bool) -> None:
    """One round's replies: clients below 10 send about GROUP_A, the others about GROUP_B
    (`groups`), or every client pure noise."""
    replies = []
    for client in clients:
        noise = 0.05 * torch.randn(SIZE, generator=gen)
        if groups:
            noise += GROUP_A if client < 10 else GROUP_B
        replies.append(update_reply(client, noise))
    alg.aggregate_train(rnd, replies)


def test_groups_are_clustered_as_soon_as_the_split_test_fires_and_noise_never() -> None:
    gen = torch.Generator().manual_seed(0)
    grouped = make_algorithm("incremental", 20, SIZE, patience=3, min_coverage=0.0)
    for rnd in range(1, 4):  # full participation: each round is a window
        assert grouped.clustered_round is None
        _round(grouped, rnd, list(range(20)), gen, groups=True)
    assert grouped.clustered_round == 3 and grouped.evidence.score > 3.5  # < warmup_rounds (10)
    assert sorted(map(sorted, grouped.clusters())) == [list(range(10)), list(range(10, 20))]
    decision = grouped.decisions[0]  # recorded with the score that decided it
    assert decision.figures["when"] == "groups"
    assert decision.figures["kway_f"] == round(grouped.evidence.score, 4)  # the window that fired
    assert decided_by(vars(decision) | decision.figures).endswith("split test found groups")

    noise = make_algorithm("incremental", 20, SIZE, patience=3, min_coverage=0.0)
    paper = make_algorithm("incremental", 20, SIZE, patience=3, min_coverage=0.0,
                           cluster_when="settled")
    for rnd in range(1, 41):
        _round(noise, rnd, list(range(20)), torch.Generator().manual_seed(rnd), groups=False)
        _round(paper, rnd, list(range(20)), torch.Generator().manual_seed(rnd), groups=False)
    assert noise.clustered_round is None and noise.evidence.score is None
    assert paper.clustered_round is not None  # the settled rule fires on noise (then Louvain's
    assert paper.num_clusters() == 1  # communities are merged back: one cluster all the same)


def test_a_single_reply_a_round_falls_back_to_the_settled_rule() -> None:
    gen = torch.Generator().manual_seed(1)
    alg = make_algorithm("incremental", 20, SIZE, patience=3, min_coverage=0.0)
    for rnd in range(1, 41):
        _round(alg, rnd, [rnd % 20], gen, groups=True)
        if alg.clustered_round is not None:
            break
    assert alg.evidence.most_replies == 1 and alg.evidence.score is None  # the test saw nothing
    assert alg.clustered_round is not None and alg.clustered_round >= 10  # warmup_rounds


def test_groups_found_before_coverage_wait_for_it_across_a_checkpoint() -> None:
    gen = torch.Generator().manual_seed(2)
    alg = make_algorithm("incremental", 20, SIZE, patience=3, min_coverage=1.0)
    for rnd in range(1, 4):  # clients 18 and 19 not seen yet
        _round(alg, rnd, [c for c in range(20) if c < 18], gen, groups=True)
    assert alg.evidence.score is not None and alg.clustered_round is None
    resumed = make_algorithm("incremental", 20, SIZE, patience=3, min_coverage=1.0)
    resumed.load_state_dict(_through_a_checkpoint_file(alg.state_dict()))
    assert resumed.evidence == alg.evidence and resumed.evidence.most_replies == 18
    assert len(alg.evidence.cuts) == 3  # the windows' cuts: the evidence
    _round(resumed, 4, [3, 18, 19], gen, groups=True)
    assert resumed.clustered_round == 4
    assert sorted(map(sorted, resumed.clusters())) == [list(range(10)), list(range(10, 20))]


def test_groups_the_stored_updates_blur_are_kept_apart_by_the_windows_that_found_them() -> None:
    """4 groups in 2 pairs: a group's update is its pair's direction plus its own (cosine 0.67
    within a pair). The ratio test lumps each pair; the same-round windows the split test fired
    on cut all four apart, and that evidence keeps them apart. Clustered at the same round by
    `cluster_round` instead (no window cuts), the pairs stay lumped."""
    pair, own = torch.eye(SIZE)[:2], torch.eye(SIZE)[2:6]

    def play(**params: object) -> list[list[int]]:
        gen = torch.Generator().manual_seed(3)
        alg = make_algorithm("incremental", 20, SIZE, patience=3, min_coverage=0.0, **params)
        for rnd in range(1, 4):
            alg.aggregate_train(rnd, [update_reply(c, pair[c // 10] + 0.7 * own[c // 5]
                                                   + 0.05 * torch.randn(SIZE, generator=gen))
                                      for c in range(20)])
        assert alg.clustered_round == 3
        assert alg.decisions[0].figures["one_level"] == 2  # Louvain + the ratio test: pairs
        return sorted(map(sorted, alg.clusters()))

    assert play() == [list(range(g * 5, g * 5 + 5)) for g in range(4)]
    assert play(cluster_when="settled", cluster_round=3) == [list(range(10)), list(range(10, 20))]
