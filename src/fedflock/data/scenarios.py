"""Heterogeneity scenarios: split a dataset into clients and hidden groups.

A scenario is a *partition* of samples to clients (iid, dirichlet, shards, quantity_skew) composed
with a *group shift* applied to every sample of a client, train and test alike (label permutation,
label swap, rotation, feature transforms). The ground-truth group of each client is returned for
evaluation only; no algorithm ever sees it. Groups are balanced: their sizes differ by at most one.

Sampling. Train and test samples come from separate pools (the dataset's official splits, or an
80/20 split of one pool for sets without a test split). Within one build every sample is handed
out at most once, to one client, as long as the pool lasts: the whole pool for the iid and
quantity_skew partitions, each class's pool for dirichlet and shards. When the clients ask for
more than that (`data.samples_per_client` or `data.test_per_client` times `data.clients` above
the pool, or a label-skew client wanting more of a class than is left), the exhausted pool is
reshuffled and reused: samples are then shared between clients (still never twice within one
client, unless that client alone asks for more than the pool holds), and a `SampleReuseWarning`
names the setting and how many draws were reused. Each `ClientData` keeps the dataset rows it drew
(`train_index`, `test_index`) so the original samples can be recovered.

`natural` (LEAF writers) ignores the partition and the seed: the clients are the writers with
the most training samples, each keeping `samples_per_client` / `test_per_client` of its own,
chosen at random by a generator seeded with the writer's id (LEAF stores a writer's samples
digits first, so the first ones would give each client a class mix its writer does not have).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedflock.config import DataConfig, ScenarioConfig
from fedflock.data import text
from fedflock.data.datasets import Dataset, load_dataset
from fedflock.data.spec import DataSpec
from fedflock.errors import ConfigError
from fedflock.registry import Registry

# A user's scenario: (dataset, data config, seed, shift seed) -> clients and hidden groups. Its
# own parameters come in `data.scenario.options`.
Scenario = Callable[["Dataset", DataConfig, int, int], "FederatedData"]
SCENARIOS: Registry[Scenario] = Registry("scenario")

SHIFTS = ("iid", "label_permutation", "label_swap", "rotation", "feature_skew",
          "category_imbalance", "environment")
SCENARIO_DOCS = {
    "iid": "same distribution everywhere (the control: a clustering method must not split)",
    "label_permutation": "group k relabels with its own fixed permutation (group 0: identity)",
    "label_swap": "group k swaps its own pairs of labels (group 0: identity)",
    "rotation": "group k rotates inputs by k*360/K degrees (concept shift on features)",
    "feature_skew": "group k applies transforms[k] to its inputs (none, invert, noise, ...)",
    "category_imbalance": "each group (client type) holds its own disjoint set of classes "
                          "(10 classes, 5 groups: 2 each)",
    "environment": "same labels, group k sees its inputs through its own seeded style "
                   "(per-channel gain and offset; group 0: unchanged)",
    "dirichlet": "label skew: class proportions per client ~ Dirichlet(alpha)",
    "shards": "label skew: each client holds `classes_per_client` classes",
    "quantity_skew": "client sizes drawn log-normal(sigma)",
    "natural": "one client per writer or user of a dataset that has them (femnist, har)",
    "topics": "text: group k holds the documents of topic k (agnews); `iid` mixes topics",
}


class SampleReuseWarning(UserWarning):
    """Clients asked for more samples than the pool holds, so some samples are shared."""


@dataclass
class ClientData:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    # Rows of the dataset behind each sample: `train_index` into `Dataset.x_train`, `test_index`
    # into `Dataset.x_test`, or into `Dataset.x_train` for sets without a test split.
    train_index: np.ndarray | None = None
    test_index: np.ndarray | None = None

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
    objective: str = "classification"
    vocab_size: int | None = None
    tokenizer: str | None = None  # text: the fitted tokenizer's JSON (saved with the run)
    source: str | None = None  # text: which file(s) the corpus was read from, in one line

    @property
    def spec(self) -> DataSpec:
        return DataSpec(self.input_shape, self.num_classes, self.objective, self.vocab_size)

    # What a client runtime asks of the data it serves (the whole federation here, one
    # partition on a deployed node: `fedflock.data.partition.NodeData`).
    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(c.num_train for c in self.clients)

    def held(self) -> dict[int, ClientData]:
        return dict(enumerate(self.clients))

    def group_of(self, client: int) -> int | None:
        return int(self.groups[client])


class _Stream:
    """Hands out `items` in random order without replacement; once all are used they are
    reshuffled and handed out again, and each such draw is counted in `reused`."""

    def __init__(self, items: np.ndarray, rng: np.random.Generator) -> None:
        self.items = items
        self.rng = rng
        self.order = rng.permutation(items)
        self.pos = 0
        self.cycled = False
        self.reused = 0

    def take(self, n: int) -> np.ndarray:
        parts: list[np.ndarray] = []
        while n > 0 and len(self.items):
            if self.pos >= len(self.order):
                order = self.rng.permutation(self.items)
                if parts:  # this request's own samples go last: no repeats while others remain
                    own = np.isin(order, np.concatenate(parts))
                    order = np.concatenate([order[~own], order[own]])
                self.order, self.pos, self.cycled = order, 0, True
            k = min(n, len(self.order) - self.pos)
            parts.append(self.order[self.pos : self.pos + k])
            if self.cycled:
                self.reused += k
            self.pos += k
            n -= k
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


class _Pool:
    """Positions in one pool, served at random (`take_any`) or per class (`take_mix`)."""

    def __init__(self, labels: np.ndarray, num_classes: int, rng: np.random.Generator) -> None:
        self.size = len(labels)
        self.any = _Stream(np.arange(len(labels)), rng)
        self.by_class = [_Stream(np.flatnonzero(labels == c), rng) for c in range(num_classes)]

    @property
    def present(self) -> np.ndarray:
        return np.array([len(s.items) > 0 for s in self.by_class])

    @property
    def reused(self) -> int:
        return self.any.reused + sum(s.reused for s in self.by_class)

    def take_any(self, n: int) -> np.ndarray:
        return self.any.take(n)

    def take_mix(self, counts: np.ndarray) -> np.ndarray:
        parts = [self.by_class[c].take(int(k)) for c, k in enumerate(counts) if k]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _class_counts(partition: str, n: int, present: np.ndarray, sc: ScenarioConfig,
                  rng: np.random.Generator, restricted: bool = False) -> np.ndarray | None:
    """Per-class sample counts of one client over the classes `present` in the pool
    (None: draw iid). A client `restricted` to some classes draws them evenly under `iid`."""
    classes = np.flatnonzero(present)
    counts = np.zeros(len(present), dtype=np.int64)
    if partition == "iid" and restricted:
        counts[classes] = n // len(classes)
        counts[rng.choice(classes, size=n % len(classes), replace=False)] += 1
        return counts
    if partition == "dirichlet":
        counts[classes] = rng.multinomial(n, rng.dirichlet(np.full(len(classes), sc.alpha)))
        return counts
    if partition == "shards":
        chosen = rng.choice(classes, size=min(sc.classes_per_client, len(classes)), replace=False)
        counts[chosen] = n // len(chosen)
        counts[chosen[: n % len(chosen)]] += 1
        return counts
    return None


def _quantity_sizes(total: int, m: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """`m` log-normal client sizes of at least min(5, total // m) that sum exactly to `total`."""
    least = max(1, min(5, total // m))
    share = rng.lognormal(0.0, sigma, size=m)
    share = share / share.sum() * (total - least * m)
    sizes = np.floor(share).astype(np.int64)
    short = int(total - least * m - sizes.sum())
    sizes[np.argsort(sizes - share, kind="stable")[:short]] += 1  # largest remainders first
    return sizes + least


def _split_pool(ds: Dataset, rng: np.random.Generator
                ) -> tuple[np.ndarray, np.ndarray, torch.Tensor, torch.Tensor]:
    """Dataset rows of the train and test pools, plus the tensors the test rows index."""
    if ds.x_test is not None and ds.y_test is not None:
        return np.arange(len(ds.y_train)), np.arange(len(ds.y_test)), ds.x_test, ds.y_test
    order = rng.permutation(len(ds.y_train))
    cut = int(0.8 * len(order))
    return order[:cut], order[cut:], ds.x_train, ds.y_train


def _rotate(x: torch.Tensor, degrees: float) -> torch.Tensor:
    """Rotate images counter-clockwise (as `torch.rot90`) about their centre."""
    if degrees % 90 == 0:
        return torch.rot90(x, k=int(degrees // 90) % 4, dims=(-2, -1)).contiguous()
    if len(x) == 0:
        return x
    theta = math.radians(degrees)
    mat = torch.tensor([[math.cos(theta), -math.sin(theta), 0.0],
                        [math.sin(theta), math.cos(theta), 0.0]], dtype=x.dtype)
    grid = F.affine_grid(mat.expand(len(x), 2, 3), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, align_corners=False)


Transform = Callable[[torch.Tensor, np.random.Generator], torch.Tensor]


@dataclass(frozen=True)
class _Shift:
    """What one hidden group does to its clients' samples."""

    transform: Transform | None = None  # on inputs; gets a generator private to the client
    label_map: torch.Tensor | None = None  # new label of every original label
    classes: np.ndarray | None = None  # mask of the classes the group holds (None: all)


def _feature_transform(kind: str, noise_std: float) -> Transform | None:
    if kind == "invert":
        return lambda x, _: 1.0 - x
    if kind == "brightness":
        return lambda x, _: (x + 0.4).clamp(0, 1)
    if kind == "contrast":
        return lambda x, _: 0.5 + 0.3 * (x - 0.5)
    if kind == "noise":
        def noisy(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
            g = torch.Generator().manual_seed(int(rng.integers(2**62)))
            return x + noise_std * torch.randn(x.shape, generator=g, dtype=x.dtype)
        return noisy
    return None  # "none"


def _draw_label_map(sc: ScenarioConfig, classes: int, rng: np.random.Generator) -> torch.Tensor:
    if sc.kind == "label_permutation":
        return torch.from_numpy(rng.permutation(classes))
    pairs = min(sc.swap_pairs or classes // 2, classes // 2)
    chosen = torch.from_numpy(rng.permutation(classes)[: 2 * pairs].reshape(pairs, 2))
    mapping = torch.arange(classes)
    mapping[chosen[:, 0]] = chosen[:, 1]
    mapping[chosen[:, 1]] = chosen[:, 0]
    return mapping


def _group_shifts(sc: ScenarioConfig, k: int, classes: int, seed: int) -> list[_Shift]:
    """The shift of each of the `k` hidden groups, fixed by `seed` (the shift seed).

    Label maps: group 0 keeps the labels; every other group gets a map that differs from the
    identity and from the other groups' maps whenever the number of classes allows it.
    """
    if sc.kind in ("label_permutation", "label_swap"):
        seen = [torch.arange(classes)]
        shifts = [_Shift()]
        for group in range(1, k):
            rng = np.random.default_rng([seed, 7, group])
            for _ in range(100):
                mapping = _draw_label_map(sc, classes, rng)
                if not any(torch.equal(mapping, other) for other in seen):
                    break
            seen.append(mapping)
            shifts.append(_Shift(label_map=mapping))
        return shifts
    if sc.kind == "rotation":
        def rotation(angle: float) -> Transform:
            return lambda x, _: _rotate(x, angle)
        return [_Shift(rotation(g * 360.0 / k) if g else None) for g in range(k)]
    if sc.kind == "feature_skew":
        # DataConfig guarantees one distinct transform per group.
        return [_Shift(_feature_transform(kind, sc.noise_std)) for kind in sc.transforms[:k]]
    if sc.kind == "category_imbalance":
        return [_Shift(classes=mask) for mask in _type_classes(classes, k, seed)]
    if sc.kind == "environment":
        return [_Shift(_environment(np.random.default_rng([seed, 13, g])) if g else None)
                for g in range(k)]
    return [_Shift() for _ in range(k)]


def _type_classes(classes: int, k: int, seed: int) -> list[np.ndarray]:
    """Disjoint class sets of `k` client types covering all classes (sizes differ by at most
    one), from a permutation fixed by the shift seed."""
    if k > classes:
        raise ConfigError(f"data.scenario.groups: category_imbalance gives each group its own "
                          f"classes, so at most {classes} groups (got {k})")
    chunks = np.array_split(np.random.default_rng([seed, 17]).permutation(classes), k)
    return [np.isin(np.arange(classes), chunk) for chunk in chunks]


def _environment(rng: np.random.Generator) -> Transform:
    """One environment's style: each input channel scaled by a gain in [0.5, 1.5] and shifted
    by an offset in [-0.3, 0.3] (lighting, sensor gain and bias), the same for all its clients
    (drawn from one seed fixed per group, once the number of channels is known)."""
    style_seed = int(rng.integers(2**62))

    def style(x: torch.Tensor, _: np.random.Generator) -> torch.Tensor:
        if x.dim() < 2:
            return x
        draw = np.random.default_rng(style_seed)
        channels = x.shape[1]
        shape = (1, channels) + (1,) * (x.dim() - 2)  # per channel of (N, C, ...)
        gain = torch.as_tensor(draw.uniform(0.5, 1.5, channels), dtype=x.dtype).reshape(shape)
        offset = torch.as_tensor(draw.uniform(-0.3, 0.3, channels), dtype=x.dtype)
        return x * gain + offset.reshape(shape)
    return style


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
        rng = np.random.default_rng([int(w), 17])
        tr, te = np.flatnonzero(wtr == w), np.flatnonzero(wte == w)
        out.append((_subset(tr, cfg.samples_per_client, rng),
                    _subset(te, cfg.test_per_client, rng)))
    return out


def _subset(rows: np.ndarray, keep: int | None, rng: np.random.Generator) -> np.ndarray:
    """`keep` of `rows` drawn at random, in their stored order (all of them when None or more)."""
    if keep is None or keep >= len(rows):
        return rows
    return np.sort(rng.choice(rows, size=keep, replace=False))


def _warn_reuse(ds: Dataset, train_pool: _Pool, test_pool: _Pool, label_skew: bool) -> None:
    parts = []
    for pool, split, key in ((train_pool, "train", "samples_per_client"),
                             (test_pool, "test", "test_per_client")):
        if pool.reused:
            parts.append(f"data.{key}: {pool.reused} {split} draws reuse samples already given "
                         f"to another client ({ds.name}'s {split} pool holds {pool.size})")
    if parts:
        where = "a class's pool" if label_skew else "the pool"
        warnings.warn(SampleReuseWarning(f"clients ask for more samples than {where} holds; "
                                          + "; ".join(parts)), stacklevel=3)


def _check_footprint(ds: Dataset, samples: int) -> None:
    """Refuse a federation that cannot fit in half of this machine's memory: a slip such as
    `samples_per_client: 1e8` would otherwise draw samples for hours before failing."""
    need = samples * 4 * math.prod(ds.input_shape)  # float32 inputs
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > memory / 2:
        raise ConfigError(f"data.samples_per_client / data.clients: {samples:,} samples of "
                          f"{ds.name} need {need / 2**30:,.1f} GiB, more than half of this "
                          f"machine's memory ({memory / 2**30:.0f} GiB)")


def text_federation(corpus: text.Corpus, cfg: DataConfig, seed: int,
                    tokenizer: str | None = None) -> FederatedData:
    """Clients of a text corpus: whole documents dealt by the scenario, split per client into
    train and test documents, tokenised by a tokenizer fitted on every client's training
    documents (or the `tokenizer` given: a trained run's, for new clients), cut into
    `data.text.seq_len`-token sequences; `samples_per_client` / `test_per_client` cap the
    sequences per client."""
    sc = cfg.scenario
    held, groups = text.deal_documents(corpus, cfg.clients, sc.kind, sc.groups, seed,
                                       coarse=cfg.text.group_by == "genre")
    if any(len(rows) < 2 for rows in held):
        raise ConfigError(f"config: data.clients: {cfg.clients} clients leave some with fewer "
                          f"than 2 of the {len(corpus.documents)} documents of {corpus.name}")
    rng = np.random.default_rng([seed, 2])
    splits = [text.split_documents(rows, rng) for rows in held]
    if tokenizer is None:
        training = [corpus.documents[i] for tr, _ in splits for i in tr]
        tokenizer = text.train_tokenizer(training, cfg.text.vocab_size, corpus.level)
    fitted = text.load_tokenizer(tokenizer)  # parsed once for every client

    def cut(rows: np.ndarray, limit: int | None, rng: np.random.Generator
            ) -> tuple[torch.Tensor, torch.Tensor]:
        stream = text.token_stream(fitted, [corpus.documents[j] for j in rows])
        return text.sequences(stream, cfg.text.seq_len, limit, rng)

    clients = []
    for i, (tr, te) in enumerate(splits):
        pair_rng = np.random.default_rng([seed, 3, i])
        x_tr, y_tr = cut(tr, cfg.samples_per_client, pair_rng)
        x_te, y_te = cut(te, cfg.test_per_client, pair_rng)
        if not len(x_tr) or not len(x_te):
            raise ConfigError(f"config: data.text.seq_len: client {i}'s documents hold fewer "
                              f"than {cfg.text.seq_len + 1} tokens on one side; shorten it")
        clients.append(ClientData(x_tr, y_tr, x_te, y_te, train_index=tr, test_index=te))
    vocab = fitted.get_vocab_size()
    return FederatedData(clients, groups, vocab, (cfg.text.seq_len,), corpus.name, "next_token",
                         vocab, tokenizer, corpus.source)


def build_federated_data(cfg: DataConfig, seed: int, shift_seed: int | None = None,
                         tokenizer: str | None = None) -> FederatedData:
    """Clients' train/test splits plus the hidden group of every client.

    `shift_seed` (default: `seed`) fixes the groups' transforms, so new clients of the same
    groups can be drawn with another `seed` (see `fedflock assign`); `tokenizer` (text only)
    tokenises them as a trained run's clients were.
    """
    shift_seed = seed if shift_seed is None else shift_seed
    ds = load_dataset(cfg.dataset, cfg.resolved_root())
    if isinstance(ds, text.Corpus):
        return text_federation(ds, cfg, seed, tokenizer)
    if cfg.scenario.kind == "topics":
        raise ConfigError(f"config: data.scenario.kind: 'topics' deals documents of a text "
                          f"dataset (agnews), not {cfg.dataset!r}")
    sc = cfg.scenario
    if sc.kind in SCENARIOS:  # a plugin's scenario
        return SCENARIOS.get(sc.kind)(ds, cfg, seed, shift_seed)
    if sc.kind == "natural":
        pairs = _natural_clients(ds, cfg)
        x_test, y_test = ds.x_test, ds.y_test
        if x_test is None or y_test is None:
            raise ConfigError(f"data.scenario.kind: 'natural' needs a dataset with a test split, "
                              f"not {ds.name!r}")
        clients = [ClientData(ds.x_train[tr], ds.y_train[tr], x_test[te], y_test[te],
                              train_index=tr, test_index=te) for tr, te in pairs]
        return FederatedData(clients, np.zeros(len(clients), dtype=np.int64), ds.num_classes,
                             ds.input_shape, ds.name, ds.objective, ds.vocab_size)

    rng = np.random.default_rng([seed, 1])
    train_rows, test_rows, x_test_src, y_test_src = _split_pool(ds, rng)
    ytr, yte = ds.y_train[train_rows].numpy(), y_test_src[test_rows].numpy()
    m = cfg.clients
    n_train = cfg.samples_per_client or max(1, len(ytr) // m)
    n_test = cfg.test_per_client or max(1, len(yte) // m)
    is_shift = sc.kind in SHIFTS
    k = sc.groups if is_shift and sc.kind != "iid" else 1
    partition = sc.partition if is_shift else sc.kind
    groups = rng.permutation(np.arange(m) % k)

    sizes = np.full(m, n_train)
    if partition == "quantity_skew":
        sizes = _quantity_sizes(n_train * m, m, sc.quantity_sigma, rng)

    _check_footprint(ds, int(sizes.sum()) + n_test * m)
    train_pool = _Pool(ytr, ds.num_classes, rng)
    test_pool = _Pool(yte, ds.num_classes, rng)
    shifts = _group_shifts(sc, k, ds.num_classes, shift_seed)
    clients = []
    for i in range(m):
        shift = shifts[groups[i]]
        held = train_pool.present if shift.classes is None else train_pool.present & shift.classes
        counts = _class_counts(partition, int(sizes[i]), held, sc, rng,
                               restricted=shift.classes is not None)
        if counts is None:
            tr = train_pool.take_any(int(sizes[i]))
            te = test_pool.take_any(n_test)
        else:
            tr = train_pool.take_mix(counts)
            weights = counts * test_pool.present  # classes absent from the test pool get none
            if weights.sum() == 0:
                weights = test_pool.present.astype(np.int64)
            test_counts = np.floor(weights / weights.sum() * n_test).astype(np.int64)
            test_counts[np.argmax(weights)] += n_test - test_counts.sum()
            te = test_pool.take_mix(test_counts)
        tr_rows, te_rows = train_rows[tr], test_rows[te]
        x_tr, y_tr = ds.x_train[tr_rows], ds.y_train[tr_rows]
        x_te, y_te = x_test_src[te_rows], y_test_src[te_rows]
        if shift.transform is not None:
            x_tr = shift.transform(x_tr, np.random.default_rng([seed, 11, i, 0]))
            x_te = shift.transform(x_te, np.random.default_rng([seed, 11, i, 1]))
        if shift.label_map is not None:
            y_tr, y_te = shift.label_map[y_tr], shift.label_map[y_te]
        clients.append(ClientData(x_tr.contiguous(), y_tr, x_te.contiguous(), y_te,
                                  train_index=tr_rows, test_index=te_rows))
    _warn_reuse(ds, train_pool, test_pool, label_skew=partition in ("dirichlet", "shards"))
    return FederatedData(clients, groups.astype(np.int64), ds.num_classes, ds.input_shape, ds.name,
                         ds.objective, ds.vocab_size)
