"""Robust aggregation rules and the attacks they face."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedflock.config import AttackConfig
from fedflock.data.poisoning import flip_labels, malicious_clients
from fedflock.robust import (
    Adversary,
    coordinate_median,
    krum_scores,
    multi_krum,
    trimmed_mean,
)
from fedflock.wire import Reply

matrices = st.integers(1, 9).flatmap(lambda n: st.integers(1, 6).flatmap(
    lambda d: st.lists(st.floats(-100, 100, allow_nan=False), min_size=n * d, max_size=n * d)
    .map(lambda v: torch.tensor(v, dtype=torch.float64).reshape(n, d))))


@settings(max_examples=100, deadline=None)
@given(matrices)
def test_median_and_trimmed_mean_match_numpy(updates: torch.Tensor) -> None:
    u = updates.numpy()
    assert np.allclose(coordinate_median(updates).numpy(), np.median(u, axis=0))
    n = len(u)
    k = min(int(0.25 * n), (n - 1) // 2)
    expected = np.sort(u, axis=0)[k : n - k].mean(0)
    assert np.allclose(trimmed_mean(updates, 0.25).numpy(), expected)
    assert torch.allclose(trimmed_mean(updates, 0.0), updates.mean(0))


def test_krum_scores_follow_the_definition() -> None:
    gen = torch.Generator().manual_seed(0)
    updates = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    f = 2
    scores = krum_scores(updates, f)
    for i in range(7):
        dists = sorted(float((updates[i] - updates[j]).pow(2).sum()) for j in range(7) if j != i)
        assert scores[i].item() == pytest.approx(sum(dists[: 7 - f - 2]))


def test_krum_resists_a_minority_and_falls_to_a_colluding_majority() -> None:
    gen = torch.Generator().manual_seed(1)
    honest = torch.ones(6, 10, dtype=torch.float64) + 0.1 * torch.randn(6, 10, generator=gen,
                                                                        dtype=torch.float64)
    attackers = -torch.ones(3, 10, dtype=torch.float64)  # identical: colluding
    minority = torch.cat([honest, attackers])
    assert (multi_krum(minority, byzantine=3) > 0).all()
    assert (multi_krum(minority, byzantine=3, selected=6) > 0).all()
    majority = torch.cat([honest[:3], -torch.ones(6, 10, dtype=torch.float64)])
    assert (multi_krum(majority, byzantine=3) < 0).all()
    assert (coordinate_median(majority) < 0).all()


def test_malicious_clients_are_seeded_and_sized() -> None:
    attack = AttackConfig(kind="sign_flip", fraction=0.6)
    bad = malicious_clients(attack, 100, seed=3)
    assert len(bad) == 60 == len(set(bad))
    assert bad == malicious_clients(attack, 100, seed=3) != malicious_clients(attack, 100, 4)
    assert malicious_clients(None, 100, 3) == []


def test_label_flip_maps_both_ways_and_keeps_the_rest() -> None:
    y = torch.arange(10)
    attack = AttackConfig(kind="label_flip", fraction=0.2)
    assert flip_labels(y, attack.label_map).tolist() == [4, 5, 6, 7, 0, 1, 2, 3, 8, 9]


def _replies(updates: torch.Tensor) -> list[Reply]:
    return [Reply(i, {"update": u.clone()}, {"loss": 0.5}, 10) for i, u in enumerate(updates)]


@pytest.mark.parametrize("colluding", [False, True])
def test_model_poisonings(colluding: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    updates = torch.randn(5, 8, generator=gen)
    bad = [1, 3]

    def poisoned(kind: str, **kw: float) -> list[Reply]:
        attack = AttackConfig(kind=kind, fraction=0.4, colluding=colluding, **kw)
        return Adversary(attack, bad, seed=0)(rnd=1, replies=_replies(updates))

    for kind in ("sign_flip", "zero", "random", "model_replacement"):
        out = poisoned(kind)
        for i in (0, 2, 4):  # honest replies are untouched
            assert torch.equal(out[i].update, updates[i])
    mean_bad = updates[bad].mean(0)
    flip = poisoned("sign_flip", scale=2.0)
    for i in bad:
        expected = -2.0 * (mean_bad if colluding else updates[i])
        assert torch.allclose(flip[i].update, expected)
    assert all(torch.equal(r.update, torch.zeros(8)) for r in poisoned("zero")[1::2])
    noise = poisoned("random")
    for i in bad:
        norm = float(updates[bad].norm(dim=1).mean() if colluding else updates[i].norm())
        assert noise[i].update.norm() == pytest.approx(norm, rel=1e-5)
        assert float(noise[i].update @ updates[i]) ** 2 < float(updates[i].norm()) ** 4
    assert torch.equal(noise[1].update, noise[3].update) == colluding
    boost = poisoned("model_replacement")  # default boost: replies / malicious replies = 5/2
    for i in bad:
        assert torch.allclose(boost[i].update,
                              2.5 * (mean_bad if colluding else updates[i]))


def test_adversary_waits_for_its_start_round_and_ignores_data_attacks() -> None:
    updates = torch.ones(3, 4)
    late = Adversary(AttackConfig(kind="zero", fraction=0.3, start_round=5), [0], seed=0)
    assert torch.equal(late(4, _replies(updates))[0].update, updates[0])
    assert torch.equal(late(5, _replies(updates))[0].update, torch.zeros(4))
    data_only = Adversary(AttackConfig(kind="label_flip", fraction=0.3), [0], seed=0)
    assert torch.equal(data_only(9, _replies(updates))[0].update, updates[0])


def test_adversary_leaves_batchnorm_buffers_honest() -> None:
    updates = torch.ones(2, 6)  # 4 trainable entries, then 2 buffer entries
    adversary = Adversary(AttackConfig(kind="sign_flip", fraction=0.5), [1], seed=0,
                          update_size=4)
    out = adversary(1, _replies(updates))
    assert out[1].update.tolist() == [-1, -1, -1, -1, 1, 1]


def test_a_data_attack_trains_honestly_before_its_start_round() -> None:
    """model_replacement (and label_flip) attackers are sleepers until `start_round`: before
    it they train on their true labels, from it on the flipped ones."""
    from fedflock.client.runtime import ClientRuntime
    from fedflock.client.tasks import Train
    from fedflock.data.scenarios import build_federated_data
    from fedflock.validation import validate
    from tests.conftest import small_config

    def runtime(attack: dict | None) -> ClientRuntime:
        cfg = validate(small_config(rounds=5, attack=attack))
        return ClientRuntime(build_federated_data(cfg.data, cfg.seed), cfg.model,
                             cfg.training, cfg.seed, attack=cfg.attack)

    honest = runtime(None)
    attacked = runtime({"kind": "model_replacement", "fraction": 0.3, "start_round": 3})
    bad = sorted(attacked.labels)[0]
    params = honest.initial_params()

    def update(rt: ClientRuntime, rnd: int) -> torch.Tensor:
        return rt.run([Train(bad, rnd, params=params)])[0].update

    assert torch.equal(update(attacked, 2), update(honest, 2))
    assert not torch.equal(update(attacked, 3), update(honest, 3))
    assert torch.equal(update(attacked, 2), update(honest, 2))  # the labels follow the round
    flipped = runtime({"kind": "label_flip", "fraction": 0.3})  # from round 1 by default
    assert not torch.equal(update(flipped, 1), update(honest, 1))
