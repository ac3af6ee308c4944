"""Heterogeneity scenarios on digits / mnist5k (no files) and on the real MNIST and FEMNIST."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedflock.config import DataConfig
from fedflock.data import ClientData, FederatedData, build_federated_data, load_dataset
from fedflock.data.datasets import Dataset
from fedflock.data.scenarios import SampleReuseWarning, _rotate
from fedflock.errors import ConfigError

SHIFT_KINDS = ["iid", "label_permutation", "label_swap", "rotation", "feature_skew",
               "category_imbalance", "environment"]
ALL_KINDS = [*SHIFT_KINDS, "dirichlet", "shards", "quantity_skew"]


def config(dataset: str = "digits", clients: int = 8, samples: int | None = 40,
           test: int | None = 10, root: Path | None = None, **scenario: Any) -> DataConfig:
    return DataConfig(dataset=dataset, root=root, clients=clients, samples_per_client=samples,
                      test_per_client=test, scenario=scenario)


def build(cfg: DataConfig, seed: int = 0, shift_seed: int | None = None) -> FederatedData:
    with warnings.catch_warnings():
        warnings.simplefilter("error", SampleReuseWarning)  # reuse must be asked for explicitly
        return build_federated_data(cfg, seed, shift_seed)


def originals(ds: Dataset, client: ClientData) -> tuple[torch.Tensor, ...]:
    """The untransformed train and test samples a client drew, from its dataset rows."""
    x_test = ds.x_test if ds.x_test is not None else ds.x_train
    y_test = ds.y_test if ds.y_test is not None else ds.y_train
    tr, te = torch.from_numpy(client.train_index), torch.from_numpy(client.test_index)
    return ds.x_train[tr], ds.y_train[tr], x_test[te], y_test[te]


def label_map_of(ds: Dataset, clients: list[ClientData], classes: int) -> torch.Tensor:
    """The one label map explaining every label the clients hold (train and test)."""
    mapping = torch.full((classes,), -1)
    for client in clients:
        _, y_tr, _, y_te = originals(ds, client)
        for orig, new in ((y_tr, client.y_train), (y_te, client.y_test)):
            for o, n in zip(orig.tolist(), new.tolist(), strict=True):
                assert mapping[o] in (-1, n), "labels of one group follow two different maps"
                mapping[o] = n
    return mapping


def group_maps(fd: FederatedData) -> dict[int, torch.Tensor]:
    ds = load_dataset(fd.dataset, None)
    return {g: label_map_of(ds, [c for c, cg in zip(fd.clients, fd.groups, strict=True) if cg == g],
                            fd.num_classes)
            for g in sorted(set(fd.groups.tolist()))}


def histograms(fd: FederatedData) -> np.ndarray:
    return np.stack([np.bincount(c.y_train.numpy(), minlength=fd.num_classes) / c.num_train
                     for c in fd.clients])


def check_disjoint(fd: FederatedData, split_pool: bool) -> None:
    """No sample twice within a client nor in two clients; train and test never overlap."""
    train = np.concatenate([c.train_index for c in fd.clients])
    test = np.concatenate([c.test_index for c in fd.clients])
    assert len(np.unique(train)) == len(train)
    assert len(np.unique(test)) == len(test)
    if split_pool:  # sets without a test split draw both from x_train
        assert not set(train.tolist()) & set(test.tolist())


# -- every scenario: shapes, sizes, groups ----------------------------------------------------

@pytest.mark.parametrize("dataset", ["digits", "mnist5k"])
@pytest.mark.parametrize("kind", ALL_KINDS)
def test_every_scenario_shapes_sizes_and_groups(dataset: str, kind: str) -> None:
    groups = 3 if kind in SHIFT_KINDS[1:] else 1
    cfg = config(dataset, clients=10, samples=30, test=8, kind=kind, groups=groups)
    fd = build(cfg)
    ds = load_dataset(dataset, None)
    assert len(fd.clients) == 10 and fd.dataset == dataset
    assert fd.num_classes == 10 and fd.input_shape == ds.input_shape
    assert fd.groups.dtype == np.int64 and fd.groups.shape == (10,)
    assert set(fd.groups.tolist()) == set(range(groups))
    sizes = np.bincount(fd.groups, minlength=groups)
    assert sizes.max() - sizes.min() <= 1
    for c in fd.clients:
        assert c.x_train.shape[1:] == ds.input_shape and c.x_test.shape[1:] == ds.input_shape
        assert c.x_train.dtype == torch.float32 and c.y_train.dtype == torch.int64
        assert c.x_train.is_contiguous() and c.x_test.is_contiguous()
        assert len(c.x_train) == len(c.y_train) == len(c.train_index) == c.num_train
        assert len(c.x_test) == len(c.y_test) == len(c.test_index) == 8
        assert c.y_train.min() >= 0 and c.y_train.max() < 10
        if kind != "quantity_skew":
            assert c.num_train == 30
    if kind == "quantity_skew":
        assert sum(c.num_train for c in fd.clients) == 300
        assert min(c.num_train for c in fd.clients) >= 5
    check_disjoint(fd, split_pool=True)


def test_default_sizes_use_the_whole_pool() -> None:
    fd = build(DataConfig(dataset="digits", clients=7))
    pool = int(0.8 * 1797)
    assert all(c.num_train == pool // 7 for c in fd.clients)
    assert all(len(c.y_test) == (1797 - pool) // 7 for c in fd.clients)
    check_disjoint(fd, split_pool=True)


@pytest.mark.parametrize("clients, groups", [(5, 2), (7, 3), (9, 4), (4, 4)])
def test_groups_are_balanced(clients: int, groups: int) -> None:
    fd = build(config(clients=clients, samples=5, test=2, kind="rotation", groups=groups))
    sizes = np.bincount(fd.groups, minlength=groups)
    assert sizes.sum() == clients and sizes.min() >= 1 and sizes.max() - sizes.min() <= 1


def test_iid_and_label_skew_have_one_group() -> None:
    for kind in ("iid", "dirichlet", "shards", "quantity_skew"):
        fd = build(config(kind=kind, groups=3))
        assert fd.groups.tolist() == [0] * 8


# -- group shifts -----------------------------------------------------------------------------

@pytest.mark.parametrize("dataset", ["digits", "mnist5k"])
def test_label_permutation(dataset: str) -> None:
    fd = build(config(dataset, clients=12, kind="label_permutation", groups=4))
    maps = group_maps(fd)
    assert torch.equal(maps[0], torch.arange(10))  # group 0 keeps the labels
    for mapping in maps.values():
        assert sorted(mapping.tolist()) == list(range(10))  # a permutation
    as_tuples = {tuple(m.tolist()) for m in maps.values()}
    assert len(as_tuples) == 4  # every group relabels differently
    ds = load_dataset(dataset, None)
    for c, g in zip(fd.clients, fd.groups, strict=True):
        x_tr, y_tr, x_te, y_te = originals(ds, c)
        assert torch.equal(c.x_train, x_tr) and torch.equal(c.x_test, x_te)
        assert torch.equal(c.y_train, maps[g][y_tr]) and torch.equal(c.y_test, maps[g][y_te])


@pytest.mark.parametrize("pairs", [None, 1, 3])
def test_label_swap(pairs: int | None) -> None:
    fd = build(config(clients=12, kind="label_swap", groups=4, swap_pairs=pairs))
    maps = group_maps(fd)
    assert torch.equal(maps[0], torch.arange(10))
    for g in (1, 2, 3):
        mapping = maps[g]
        assert torch.equal(mapping[mapping], torch.arange(10))  # swaps are involutions
        moved = int((mapping != torch.arange(10)).sum())
        assert moved == 2 * (pairs or 5)
    assert len({tuple(m.tolist()) for m in maps.values()}) == 4


def test_label_swap_pairs_capped_by_classes() -> None:
    fd = build(config(clients=4, kind="label_swap", groups=2, swap_pairs=50))
    assert int((group_maps(fd)[1] != torch.arange(10)).sum()) == 10


@pytest.mark.parametrize("dataset", ["digits", "mnist5k"])
def test_rotation_four_groups_is_rot90(dataset: str) -> None:
    fd = build(config(dataset, clients=8, kind="rotation", groups=4))
    ds = load_dataset(dataset, None)
    for c, g in zip(fd.clients, fd.groups, strict=True):
        x_tr, y_tr, x_te, y_te = originals(ds, c)
        assert torch.equal(c.x_train, torch.rot90(x_tr, k=int(g), dims=(-2, -1)))
        assert torch.equal(c.x_test, torch.rot90(x_te, k=int(g), dims=(-2, -1)))
        assert torch.equal(c.y_train, y_tr) and torch.equal(c.y_test, y_te)


def test_rotation_by_other_angles_turns_the_same_way() -> None:
    fd = build(config("mnist5k", clients=8, samples=5, test=2, kind="rotation", groups=8))
    ds = load_dataset("mnist5k", None)
    for c, g in zip(fd.clients, fd.groups, strict=True):
        x_tr = originals(ds, c)[0]
        if g % 2 == 0:
            assert torch.equal(c.x_train, torch.rot90(x_tr, k=int(g) // 2, dims=(-2, -1)))
        else:  # 45-degree steps: interpolated, same mass, same value range
            assert torch.allclose(c.x_train.sum(), x_tr.sum(), rtol=0.1)
            assert not torch.equal(c.x_train, x_tr)
    # The interpolated path rotates in the same direction as rot90.
    dot = torch.zeros(1, 1, 28, 28)
    dot[0, 0, 3, 20] = 1.0
    exact = torch.rot90(dot, k=1, dims=(-2, -1)).flatten().argmax()
    assert _rotate(dot, 89.999).flatten().argmax() == exact
    assert _rotate(dot, 90.0).flatten().argmax() == exact


def test_feature_skew_default_transforms() -> None:
    fd = build(config("mnist5k", clients=10, kind="feature_skew", groups=5, noise_std=0.5))
    ds = load_dataset("mnist5k", None)
    seen = set()
    for c, g in zip(fd.clients, fd.groups, strict=True):
        x_tr, y_tr, x_te, y_te = originals(ds, c)
        assert torch.equal(c.y_train, y_tr) and torch.equal(c.y_test, y_te)
        for new, old in ((c.x_train, x_tr), (c.x_test, x_te)):
            if g == 0:  # none
                assert torch.equal(new, old)
            elif g == 1:  # invert
                assert torch.allclose(new, 1.0 - old)
            elif g == 2:  # gaussian noise
                residual = new - old
                assert abs(float(residual.std()) - 0.5) < 0.02
                assert abs(float(residual.mean())) < 0.02
            elif g == 3:  # brightness
                assert torch.allclose(new, (old + 0.4).clamp(0, 1))
            else:  # contrast
                assert torch.allclose(new, 0.5 + 0.3 * (old - 0.5))
        seen.add(int(g))
    assert seen == set(range(5))


def test_feature_skew_uses_the_listed_transform_of_every_group() -> None:
    fd = build(config("digits", clients=4, kind="feature_skew", groups=2,
                      transforms=["invert", "brightness"]))
    ds = load_dataset("digits", None)
    for c, g in zip(fd.clients, fd.groups, strict=True):
        old = originals(ds, c)[0]
        expected = 1.0 - old if g == 0 else (old + 0.4).clamp(0, 1)
        assert torch.allclose(c.x_train, expected)


def test_feature_skew_needs_one_distinct_transform_per_group() -> None:
    from fedflock.validation import validate

    for groups, transforms in ((3, ["none", "invert"]), (2, ["noise", "noise"])):
        raw = {"data": {"dataset": "digits", "clients": 6, "scenario": {
            "kind": "feature_skew", "groups": groups, "transforms": transforms}}}
        with pytest.raises(ConfigError, match=r"scenario\.transforms"):
            validate(raw)


def test_noise_differs_between_clients_and_splits() -> None:
    fd = build(config("digits", clients=4, kind="feature_skew", groups=1, transforms=["noise"]))
    ds = load_dataset("digits", None)
    residuals = [c.x_train - originals(ds, c)[0] for c in fd.clients]
    assert not torch.allclose(residuals[0], residuals[1])


# -- partitions -------------------------------------------------------------------------------

@pytest.mark.parametrize("dataset", ["digits", "mnist5k"])
def test_category_imbalance_types_hold_disjoint_classes(dataset: str) -> None:
    fd = build(config(dataset, clients=10, samples=40, test=10, kind="category_imbalance",
                      groups=5))
    ds = load_dataset(dataset, None)
    held: dict[int, set[int]] = {}
    for c, g in zip(fd.clients, fd.groups, strict=True):
        train = set(c.y_train.tolist())
        assert set(c.y_test.tolist()) <= train  # tested on its own type's classes
        counts = np.bincount(c.y_train.numpy())
        assert len(train) == 2 and counts[sorted(train)].tolist() == [20, 20]
        assert held.setdefault(int(g), train) == train  # every client of a type: same classes
        x_tr, y_tr, _, _ = originals(ds, c)
        assert torch.equal(c.x_train, x_tr) and torch.equal(c.y_train, y_tr)  # labels kept
    assert sorted(cls for classes in held.values() for cls in classes) == list(range(10))


def test_category_imbalance_uneven_split_and_too_many_types() -> None:
    fd = build(config("digits", clients=6, samples=30, kind="category_imbalance", groups=3))
    sizes = sorted(len(set(c.y_train.tolist())) for c in fd.clients)
    assert sizes == [3, 3, 3, 3, 4, 4]  # 10 classes over 3 types: 4 + 3 + 3
    with pytest.raises(ConfigError, match="at most 10 groups"):
        build(config("digits", clients=12, kind="category_imbalance", groups=11))


def test_environment_is_a_fixed_affine_style_per_group() -> None:
    cfg = config("mnist5k", clients=6, samples=30, kind="environment", groups=3)
    fd, fresh = build(cfg), build(cfg, 1, shift_seed=0)
    ds = load_dataset("mnist5k", None)
    styles: dict[int, tuple[float, float]] = {}
    for data in (fd, fresh):
        for c, g in zip(data.clients, data.groups, strict=True):
            x, y, _, _ = originals(ds, c)
            assert torch.equal(c.y_train, y)  # same labels
            gain, offset = np.polyfit(x.flatten().numpy(), c.x_train.flatten().numpy(), 1)
            assert np.allclose(c.x_train, gain * x + offset, atol=1e-5)
            style = styles.setdefault(int(g), (gain, offset))  # one style per group
            assert np.allclose(style, (gain, offset), atol=1e-5)
    assert np.allclose(styles[0], (1.0, 0.0))  # group 0 unchanged
    assert len({round(s[0], 4) for s in styles.values()}) == 3


def test_dirichlet_smaller_alpha_is_more_skewed() -> None:
    def skew(alpha: float) -> float:
        fd = build(config("mnist5k", clients=10, samples=100, test=20, kind="dirichlet",
                          alpha=alpha))
        return float(histograms(fd).max(axis=1).mean())  # share of each client's top class

    tiny, mid, flat = skew(0.05), skew(1.0), skew(1000.0)
    assert tiny > mid > flat
    assert tiny > 0.6 and flat < 0.2


def test_dirichlet_test_labels_follow_the_train_labels() -> None:
    fd = build(config("mnist5k", clients=10, samples=100, test=20, kind="dirichlet", alpha=0.1))
    for c in fd.clients:
        train_classes = set(c.y_train.tolist())
        assert set(c.y_test.tolist()) <= train_classes


@pytest.mark.parametrize("per_client", [1, 2, 3])
def test_shards_classes_per_client(per_client: int) -> None:
    fd = build(config("mnist5k", clients=10, samples=60, test=12, kind="shards",
                      classes_per_client=per_client))
    for c in fd.clients:
        classes = set(c.y_train.tolist())
        assert len(classes) == per_client
        assert set(c.y_test.tolist()) <= classes
        assert np.ptp(np.bincount(c.y_train.numpy())[list(classes)]) <= 1  # even split


def test_quantity_skew_sizes_are_unequal() -> None:
    fd = build(config("mnist5k", clients=10, samples=100, kind="quantity_skew",
                      quantity_sigma=1.0))
    sizes = [c.num_train for c in fd.clients]
    assert len(set(sizes)) > 5 and max(sizes) > 2 * min(sizes)
    assert sum(sizes) == 1000 and min(sizes) >= 5
    fd = build(DataConfig(dataset="digits", clients=10, scenario={"kind": "quantity_skew"}))
    check_disjoint(fd, split_pool=True)  # defaults never exceed the pool


def test_rotation_composed_with_dirichlet() -> None:
    cfg = config("mnist5k", clients=8, samples=60, test=10, kind="rotation", groups=4,
                 partition="dirichlet", alpha=0.05)
    fd = build(cfg)
    ds = load_dataset("mnist5k", None)
    for c, g in zip(fd.clients, fd.groups, strict=True):
        x_tr, y_tr, _, _ = originals(ds, c)
        assert torch.equal(c.x_train, torch.rot90(x_tr, k=int(g), dims=(-2, -1)))
        assert torch.equal(c.y_train, y_tr)
    assert histograms(fd).max(axis=1).mean() > 0.5
    assert sorted(np.bincount(fd.groups).tolist()) == [2, 2, 2, 2]


def test_label_permutation_composed_with_shards() -> None:
    fd = build(config("mnist5k", clients=8, samples=40, test=10, kind="label_permutation",
                      groups=2, partition="shards", classes_per_client=2))
    identity = group_maps(fd)[0]
    seen = identity >= 0  # only the classes group 0's shards hold
    assert torch.equal(identity[seen], torch.arange(10)[seen])
    for c in fd.clients:
        assert len(set(c.y_train.tolist())) == 2


# -- pool exhaustion --------------------------------------------------------------------------

def test_asking_more_than_the_pool_reuses_with_a_warning() -> None:
    cfg = config("digits", clients=10, samples=200, test=10)  # 2,000 > 1,437 train samples
    with pytest.warns(SampleReuseWarning, match=r"data\.samples_per_client") as record:
        fd = build_federated_data(cfg, 0)
    assert len(record) == 1 and "test_per_client" not in str(record[0].message)
    train = np.concatenate([c.train_index for c in fd.clients])
    assert len(np.unique(train)) == int(0.8 * 1797)  # the whole pool is used before any reuse
    for c in fd.clients:
        assert len(np.unique(c.train_index)) == c.num_train  # never twice within one client
    test = np.concatenate([c.test_index for c in fd.clients])
    assert len(np.unique(test)) == len(test)  # test asks 100 of 360: no reuse


def test_test_pool_exhaustion_names_test_per_client() -> None:
    with pytest.warns(SampleReuseWarning, match=r"data\.test_per_client"):
        build_federated_data(config("digits", clients=4, samples=10, test=100), 0)


def test_a_client_bigger_than_a_class_pool_repeats_only_then() -> None:
    cfg = config("digits", clients=2, samples=400, test=10, kind="shards", classes_per_client=1)
    with pytest.warns(SampleReuseWarning, match="class"):
        fd = build_federated_data(cfg, 0)
    for c in fd.clients:  # one class (~144 samples) handed out over and over, evenly
        _, uses = np.unique(c.train_index, return_counts=True)
        assert 100 < len(uses) < 200 and uses.max() - uses.min() <= 1


# -- determinism and shift seed ---------------------------------------------------------------

def same(a: FederatedData, b: FederatedData) -> bool:
    if not np.array_equal(a.groups, b.groups):
        return False
    return all(torch.equal(getattr(x, f), getattr(y, f))
               for x, y in zip(a.clients, b.clients, strict=True)
               for f in ("x_train", "y_train", "x_test", "y_test"))


@pytest.mark.parametrize("kind, extra", [
    ("iid", {}), ("label_permutation", {"groups": 3}), ("feature_skew", {"groups": 3}),
    ("rotation", {"groups": 3, "partition": "dirichlet"}), ("shards", {}),
    ("quantity_skew", {}),
])
def test_same_seed_same_data_other_seed_other_data(kind: str, extra: dict) -> None:
    cfg = config("digits", clients=6, kind=kind, **extra)
    assert same(build(cfg, 3), build(cfg, 3))
    assert not same(build(cfg, 3), build(cfg, 4))


def test_shift_seed_keeps_the_group_transforms() -> None:
    cfg = config("digits", clients=8, kind="label_permutation", groups=4)
    trained = build(cfg, 0)
    fresh = build(cfg, 1, shift_seed=0)
    other = build(cfg, 1)
    assert not same(trained, fresh)  # new samples and group assignment
    assert not np.array_equal(
        np.concatenate([c.train_index for c in trained.clients]),
        np.concatenate([c.train_index for c in fresh.clients]))
    kept, changed = group_maps(trained), group_maps(fresh)
    assert all(torch.equal(kept[g], changed[g]) for g in range(4))
    redrawn = group_maps(other)
    assert any(not torch.equal(kept[g], redrawn[g]) for g in range(1, 4))


def test_shift_seed_keeps_feature_noise_level_and_rotation() -> None:
    cfg = config("mnist5k", clients=4, kind="rotation", groups=4)
    fresh = build(cfg, 5, shift_seed=0)
    ds = load_dataset("mnist5k", None)
    for c, g in zip(fresh.clients, fresh.groups, strict=True):
        assert torch.equal(c.x_train, torch.rot90(originals(ds, c)[0], k=int(g), dims=(-2, -1)))


# -- real datasets ----------------------------------------------------------------------------

def test_mnist_label_permutation(shared_data: Path) -> None:
    cfg = config("mnist", clients=20, samples=500, test=100, root=shared_data,
                 kind="label_permutation", groups=4)
    fd = build(cfg)
    ds = load_dataset("mnist", shared_data)
    assert sorted(np.bincount(fd.groups).tolist()) == [5, 5, 5, 5]
    maps = {}
    for c, g in zip(fd.clients, fd.groups, strict=True):
        assert c.num_train == 500 and len(c.y_test) == 100
        assert torch.equal(c.x_test, ds.x_test[torch.from_numpy(c.test_index)])  # official test
        mapping = maps.setdefault(int(g), label_map_of(ds, [c], 10))
        assert torch.equal(c.y_train, mapping[ds.y_train[torch.from_numpy(c.train_index)]])
        assert torch.equal(c.y_test, mapping[ds.y_test[torch.from_numpy(c.test_index)]])
    assert torch.equal(maps[0][maps[0] >= 0], torch.arange(10))
    check_disjoint(fd, split_pool=False)


def test_mnist_rotation_and_dirichlet(shared_data: Path) -> None:
    ds = load_dataset("mnist", shared_data)
    fd = build(config("mnist", clients=8, samples=200, test=50, root=shared_data,
                      kind="rotation", groups=4))
    for c, g in zip(fd.clients, fd.groups, strict=True):
        test_rows = torch.from_numpy(c.test_index)
        assert torch.equal(c.x_test, torch.rot90(ds.x_test[test_rows], k=int(g), dims=(-2, -1)))
    fd = build(config("mnist", clients=20, samples=300, test=50, root=shared_data,
                      kind="dirichlet", alpha=0.1))
    assert histograms(fd).max(axis=1).mean() > 0.5
    check_disjoint(fd, split_pool=False)


def test_femnist_natural_writers(shared_data: Path) -> None:
    ds = load_dataset("femnist", shared_data)
    fd = build(config("femnist", clients=30, samples=None, test=None, root=shared_data,
                      kind="natural"))
    assert len(fd.clients) == 30 and fd.num_classes == 62 and fd.groups.tolist() == [0] * 30
    assert ds.writers_train is not None and ds.writers_test is not None
    writers = []
    for c in fd.clients:
        w_tr = ds.writers_train[torch.from_numpy(c.train_index)].unique()
        w_te = ds.writers_test[torch.from_numpy(c.test_index)].unique()
        assert len(w_tr) == 1 and w_tr.tolist() == w_te.tolist()  # one writer, test from it too
        writer = int(w_tr)
        assert c.num_train == int((ds.writers_train == writer).sum())  # all of its samples
        assert len(c.y_test) == int((ds.writers_test == writer).sum()) > 0
        assert torch.equal(c.x_train, ds.x_train[torch.from_numpy(c.train_index)])
        writers.append(writer)
    assert len(set(writers)) == 30
    sizes = [c.num_train for c in fd.clients]
    assert sizes == sorted(sizes, reverse=True)  # the writers with the most samples


def test_femnist_natural_caps_and_limits(shared_data: Path) -> None:
    fd = build(config("femnist", clients=5, samples=50, test=7, root=shared_data,
                      kind="natural"))
    assert all(c.num_train == 50 and len(c.y_test) <= 7 for c in fd.clients)
    with pytest.raises(ConfigError, match=r"data\.clients: femnist has 105 writers"):
        build(config("femnist", clients=106, root=shared_data, kind="natural"))


def test_femnist_natural_keeps_a_writers_class_mix(shared_data: Path) -> None:
    """LEAF stores each writer's samples digits first: a client keeping 50 of its writer's
    ~150 samples must hold about the writer's share of digits, not only digits."""
    full = build(config("femnist", clients=5, samples=None, root=shared_data, kind="natural"))
    capped = build(config("femnist", clients=5, samples=50, root=shared_data, kind="natural"))
    for whole, kept in zip(full.clients, capped.clients, strict=True):
        assert abs(_digit_share(kept.y_train) - _digit_share(whole.y_train)) < 0.25
        assert set(kept.train_index) <= set(whole.train_index)


def _digit_share(labels: torch.Tensor) -> float:
    return float((labels < 10).float().mean())


def test_natural_needs_writers() -> None:
    with pytest.raises(ConfigError, match="natural"):
        build(config("digits", kind="natural"))
