"""Heterogeneity scenarios: split a dataset into clients and hidden groups.

A scenario is a *partition* of samples to clients (iid, dirichlet, shards, quantity_skew) composed
with a *group shift* applied to every sample of a client, train and test alike (label permutation,
label swap, rotation, feature transforms). The ground-truth group of each client is returned for
evaluation only; no algorithm ever sees it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedflock.config import DataConfig, ScenarioConfig
from fedflock.data.datasets import Dataset, load_dataset
from fedflock.errors import ConfigError

SHIFTS = ("iid", "label_permutation", "label_swap", "rotation", "feature_skew")
SCENARIO_DOCS = {
    "iid": "same distribution everywhere (the control: a clustering method must not split)",
    "label_permutation": "group k relabels with its own fixed permutation (group 0: identity)",
    "label_swap": "group k swaps its own pairs of labels (group 0: identity)",
    "rotation": "group k rotates inputs by k*360/K degrees (concept shift on features)",
    "feature_skew": "group k applies its own input transform (noise, brightness, inversion...)",
    "dirichlet": "label skew: class proportions per client ~ Dirichlet(alpha)",
    "shards": "label skew: each client holds `classes_per_client` classes",
    "quantity_skew": "client sizes drawn log-normal(sigma)",
    "natural": "one client per writer of a LEAF dataset (femnist)",
}


@dataclass
class ClientData:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def num_train(self) -> int:
        return len(self.y_train)


@dataclass
class FederatedData:
    clients: list[ClientData]
    groups: np.ndarray  # ground-truth group of every client: evaluation only
    num_classes: int
    input_shape: tuple[int, ...]
    dataset: str


class _Pool:
    """Serves sample indices per class without replacement, reshuffling a class when it runs out."""

    def __init__(self, labels: np.ndarray, num_classes: int, rng: np.random.Generator) -> None:
        self.rng = rng
        self.by_class = [np.flatnonzero(labels == c) for c in range(num_classes)]
        self.order = [rng.permutation(ix) for ix in self.by_class]
        self.pos = [0] * num_classes
        self.all = rng.permutation(len(labels))
        self.all_pos = 0

    def take_class(self, c: int, n: int) -> np.ndarray:
        out = []
        while n > 0 and len(self.by_class[c]):
            if self.pos[c] >= len(self.order[c]):
                self.order[c], self.pos[c] = self.rng.permutation(self.by_class[c]), 0
            k = min(n, len(self.order[c]) - self.pos[c])
            out.append(self.order[c][self.pos[c] : self.pos[c] + k])
            self.pos[c] += k
            n -= k
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    def take_any(self, n: int) -> np.ndarray:
        out = []
        while n > 0:
            if self.all_pos >= len(self.all):
                self.all, self.all_pos = self.rng.permutation(len(self.all)), 0
            k = min(n, len(self.all) - self.all_pos)
            out.append(self.all[self.all_pos : self.all_pos + k])
            self.all_pos += k
            n -= k
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    def take_mix(self, counts: np.ndarray) -> np.ndarray:
        return np.concatenate([self.take_class(c, int(k)) for c, k in enumerate(counts) if k])


def _class_counts(partition: str, n: int, classes: int, sc: ScenarioConfig,
                  rng: np.random.Generator) -> np.ndarray | None:
    """Per-class sample counts of one client (None: draw iid)."""
    if partition == "dirichlet":
        return rng.multinomial(n, rng.dirichlet(np.full(classes, sc.alpha)))
    if partition == "shards":
        chosen = rng.choice(classes, size=min(sc.classes_per_client, classes), replace=False)
        counts = np.zeros(classes, dtype=np.int64)
        counts[chosen] = n // len(chosen)
        counts[chosen[: n % len(chosen)]] += 1
        return counts
    return None


def _split_pool(ds: Dataset, rng: np.random.Generator):
    if ds.x_test is not None:
        return ds.x_train, ds.y_train, ds.x_test, ds.y_test
    order = torch.from_numpy(rng.permutation(len(ds.y_train)))
    cut = int(0.8 * len(order))
    tr, te = order[:cut], order[cut:]
    return ds.x_train[tr], ds.y_train[tr], ds.x_train[te], ds.y_train[te]


def _rotate(x: torch.Tensor, degrees: float) -> torch.Tensor:
    if degrees % 90 == 0:
        return torch.rot90(x, k=int(degrees // 90) % 4, dims=(-2, -1)).contiguous()
    theta = math.radians(degrees)
    mat = torch.tensor([[math.cos(theta), -math.sin(theta), 0.0],
                        [math.sin(theta), math.cos(theta), 0.0]], dtype=x.dtype)
    grid = F.affine_grid(mat.expand(len(x), 2, 3), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, align_corners=False)


def _group_shift(sc: ScenarioConfig, group: int, classes: int, seed: int
                 ) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor | None]:
    """(input transform, label map) of one hidden group; group 0 is always the identity."""
    rng = np.random.default_rng([seed, 7, group])
    identity = lambda x: x  # noqa: E731
    if group == 0 or sc.kind in ("iid", "dirichlet", "shards", "quantity_skew", "natural"):
        return identity, None
    if sc.kind == "label_permutation":
        return identity, torch.from_numpy(rng.permutation(classes))
    if sc.kind == "label_swap":
        pairs = min(sc.swap_pairs or classes // 2, classes // 2)
        chosen = rng.permutation(classes)[: 2 * pairs].reshape(pairs, 2)
        mapping = torch.arange(classes)
        mapping[chosen[:, 0]], mapping[chosen[:, 1]] = (
            torch.from_numpy(chosen[:, 1]), torch.from_numpy(chosen[:, 0])
        )
        return identity, mapping
    if sc.kind == "rotation":
        angle = group * 360.0 / sc.groups
        return (lambda x: _rotate(x, angle)), None
    kind = sc.transforms[group % len(sc.transforms)]
    if kind == "invert":
        return (lambda x: 1.0 - x), None
    if kind == "brightness":
        return (lambda x: (x + 0.4).clamp(0, 1)), None
    if kind == "contrast":
        return (lambda x: 0.5 + 0.3 * (x - 0.5)), None
    if kind == "noise":
        def noisy(x: torch.Tensor) -> torch.Tensor:
            g = torch.Generator().manual_seed(int(rng.integers(2**31)))
            return x + sc.noise_std * torch.randn(x.shape, generator=g)
        return noisy, None
    return identity, None


def _natural_clients(ds: Dataset, cfg: DataConfig) -> list[tuple[np.ndarray, np.ndarray]]:
    if ds.writers_train is None or ds.writers_test is None:
        raise ConfigError(f"data.scenario.kind: 'natural' needs a dataset with writers, "
                          f"not {ds.name!r}")
    wtr, wte = ds.writers_train.numpy(), ds.writers_test.numpy()
    writers, counts = np.unique(wtr, return_counts=True)
    has_test = np.isin(writers, wte)
    ranked = writers[has_test][np.argsort(-counts[has_test], kind="stable")]
    if cfg.clients > len(ranked):
        raise ConfigError(f"data.clients: {ds.name} has {len(ranked)} writers with train and "
                          f"test data (got {cfg.clients})")
    out = []
    for w in ranked[: cfg.clients]:
        tr, te = np.flatnonzero(wtr == w), np.flatnonzero(wte == w)
        out.append((tr[: cfg.samples_per_client], te[: cfg.test_per_client]))
    return out


def build_federated_data(cfg: DataConfig, seed: int, shift_seed: int | None = None
                         ) -> FederatedData:
    """Clients' train/test splits plus the hidden group of every client.

    `shift_seed` (default: `seed`) fixes the groups' transforms, so new clients of the same
    groups can be drawn with another `seed` (see `fedflock assign`).
    """
    shift_seed = seed if shift_seed is None else shift_seed
    ds = load_dataset(cfg.dataset, cfg.resolved_root())
    sc = cfg.scenario
    rng = np.random.default_rng([seed, 1])
    if sc.kind == "natural":
        pairs = _natural_clients(ds, cfg)
        clients = [ClientData(ds.x_train[tr], ds.y_train[tr], ds.x_test[te], ds.y_test[te])
                   for tr, te in pairs]
        return FederatedData(clients, np.zeros(len(clients), dtype=np.int64), ds.num_classes,
                             ds.input_shape, ds.name)

    xtr, ytr, xte, yte = _split_pool(ds, rng)
    m = cfg.clients
    n_train = cfg.samples_per_client or max(1, len(ytr) // m)
    n_test = cfg.test_per_client or max(1, len(yte) // m)
    is_shift = sc.kind in SHIFTS
    k = sc.groups if is_shift and sc.kind != "iid" else 1
    partition = sc.partition if is_shift else sc.kind
    groups = rng.permutation(np.arange(m) % k)

    sizes = np.full(m, n_train)
    if partition == "quantity_skew":
        raw = rng.lognormal(0.0, sc.quantity_sigma, size=m)
        sizes = np.maximum(5, np.round(raw / raw.sum() * n_train * m)).astype(int)

    train_pool = _Pool(ytr.numpy(), ds.num_classes, rng)
    test_pool = _Pool(yte.numpy(), ds.num_classes, rng)
    shifts = [_group_shift(sc, g, ds.num_classes, shift_seed) for g in range(k)]
    clients = []
    for i in range(m):
        counts = _class_counts(partition, int(sizes[i]), ds.num_classes, sc, rng)
        if counts is None:
            tr = train_pool.take_any(int(sizes[i]))
            te = test_pool.take_any(n_test)
        else:
            tr = train_pool.take_mix(counts)
            test_counts = np.floor(counts / counts.sum() * n_test).astype(int)
            test_counts[np.argmax(counts)] += n_test - test_counts.sum()
            te = test_pool.take_mix(test_counts)
        transform, label_map = shifts[groups[i]]
        x_tr, y_tr = transform(xtr[tr]), ytr[tr]
        x_te, y_te = transform(xte[te]), yte[te]
        if label_map is not None:
            y_tr, y_te = label_map[y_tr], label_map[y_te]
        clients.append(ClientData(x_tr.contiguous(), y_tr, x_te.contiguous(), y_te))
    return FederatedData(clients, groups.astype(np.int64), ds.num_classes, ds.input_shape, ds.name)
