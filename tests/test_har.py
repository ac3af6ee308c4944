"""HAR users (UCI HAPT raw signals): windows recomputed here from the raw npz with plain loops,
the time split per user and activity, one natural client per user, malformed files refused."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import fedflock.data.datasets as D
from fedflock.config import DataConfig, ScenarioConfig
from fedflock.data.scenarios import build_federated_data
from fedflock.errors import ConfigError, DataError

USER = 7


def _npz(root: Path) -> Path:
    return root / "har_hapt" / "hapt_raw_signals.npz"


@pytest.fixture(scope="module")
def decoded(shared_data: Path) -> dict[str, torch.Tensor]:
    return D._har_arrays(_npz(shared_data))


def _expected_windows(npz: Path, user: int) -> tuple[list[int], list[int], list[int]]:
    """(window starts, labels 0..5, train flags) of `user`, in time order, from the raw npz."""
    with np.load(npz) as z:
        label, who, rec = z["label"].tolist(), z["user"].tolist(), z["recording"].tolist()
    runs: list[tuple[int, int, int]] = []  # (first row, end row, label) of one user's runs
    for i in range(len(label)):
        if who[i] != user:
            continue
        if runs and runs[-1][1] == i and label[i] == runs[-1][2] and rec[i] == rec[i - 1]:
            runs[-1] = (runs[-1][0], i + 1, label[i])
        else:
            runs.append((i, i + 1, label[i]))
    starts, labels = [], []
    for first, end, activity in runs:
        if 1 <= activity <= 6:
            s = first
            while s + 128 <= end:
                starts.append(s)
                labels.append(activity - 1)
                s += 64
    train = [False] * len(starts)
    for activity in range(6):
        mine = [i for i in range(len(starts)) if labels[i] == activity]
        k = math.ceil(0.8 * len(mine))
        for i in mine[:k]:
            train[i] = True
        for i in mine[k:]:  # test windows sharing samples with the last training one: dropped
            if starts[i] < starts[mine[k - 1]] + 128:
                train[i] = None  # type: ignore[call-overload]
    return starts, labels, train  # type: ignore[return-value]


def test_one_users_windows_are_the_raw_samples_standardised(shared_data: Path) -> None:
    npz = _npz(shared_data)
    ds = D.load_har.__wrapped__(shared_data)
    starts, labels, train = _expected_windows(npz, USER)
    with np.load(npz) as z:
        signals = z["signals"]
    for split, x, y, w in (("train", ds.x_train, ds.y_train, ds.writers_train),
                           ("test", ds.x_test, ds.y_test, ds.writers_test)):
        rows = [i for i in range(len(starts)) if train[i] is (split == "train")]
        mine = w == USER
        assert int(mine.sum()) == len(rows) > 0, split
        assert y[mine].tolist() == [labels[i] for i in rows]
        raw = np.stack([signals[starts[i]:starts[i] + 128].T for i in rows])  # (n, 6, 128)
        got = x[mine].double().numpy()
        # The same samples up to one affine map per channel (the standardisation).
        scale = raw.std(axis=(0, 2)) / got.std(axis=(0, 2))
        shift = raw.mean(axis=(0, 2)) - scale * got.mean(axis=(0, 2))
        assert np.allclose(got * scale[:, None] + shift[:, None], raw, atol=1e-5)
    assert ds.input_shape == (6, 128) and ds.num_classes == 6
    x = ds.x_train.double()
    moments = torch.stack([x.mean(dim=(0, 2)), x.std(dim=(0, 2))])
    assert torch.allclose(moments, torch.tensor([[0.0] * 6, [1.0] * 6], dtype=torch.float64),
                          atol=1e-3)


def test_test_windows_come_after_training_per_user_and_activity(
        shared_data: Path, decoded: dict[str, torch.Tensor]) -> None:
    t = {k: v.numpy() for k, v in decoded.items()}
    with np.load(_npz(shared_data)) as z:
        label, rec = z["label"], z["recording"]
    every = np.concatenate([t["str"], t["ste"]])[:, None] + np.arange(128)
    assert (label[every] == np.concatenate([t["ytr"], t["yte"]])[:, None] + 1).all()
    assert (rec[every] == rec[every[:, :1]]).all()  # inside one labelled run of one recording
    for user in range(1, 31):
        for activity in range(6):
            tr = t["str"][(t["wtr"] == user) & (t["ytr"] == activity)]
            te = t["ste"][(t["wte"] == user) & (t["yte"] == activity)]
            assert len(tr) and len(te), (user, activity)
            assert te.min() >= tr.max() + 128, (user, activity)  # no shared sample, later
            assert 0.78 <= len(tr) / (len(tr) + len(te)) <= 0.87


def test_natural_scenario_gives_one_client_per_user(shared_data: Path) -> None:
    cfg = DataConfig(dataset="har", root=shared_data, clients=30,
                     scenario=ScenarioConfig(kind="natural"))
    fd = build_federated_data(cfg, 0)
    ds = D.load_har(shared_data)
    assert len(fd.clients) == 30 and fd.input_shape == (6, 128) and fd.num_classes == 6
    users = set()
    for c in fd.clients:
        (user,) = set(ds.writers_train[torch.from_numpy(c.train_index)].tolist())
        assert set(ds.writers_test[torch.from_numpy(c.test_index)].tolist()) == {user}
        assert set(c.y_test.tolist()) == set(range(6))
        users.add(user)
    assert users == set(range(1, 31))
    with pytest.raises(ConfigError, match="har has 30 writers"):
        build_federated_data(cfg.model_copy(update={"clients": 31}), 0)


def _valid_arrays() -> dict[str, np.ndarray]:
    """One user, one recording: the six activities in runs of 1,000 samples (14 windows each),
    with a transition run and an unlabelled run among them."""
    labels = np.concatenate([np.full(1000, a) for a in (-1, 1, 2, 3, 7, 4, 5, 6)])
    n = len(labels)
    rng = np.random.default_rng(0)
    return {"signals": rng.normal(size=(n, 6)), "label": labels.astype(np.int8),
            "user": np.full(n, 3, dtype=np.int8), "recording": np.zeros(n, dtype=np.int8),
            "sample_index": np.arange(n, dtype=np.int32)}


def _save(root: Path, arrays: dict[str, np.ndarray]) -> None:
    _npz(root).parent.mkdir(parents=True)
    np.savez(_npz(root), **arrays)


def test_a_small_valid_file_loads(tmp_path: Path) -> None:
    """14 windows per activity: 12 (80%, rounded up) train; the 13th shares samples with the
    12th and is dropped; the 14th is the test window."""
    _save(tmp_path, _valid_arrays())
    ds = D.load_har.__wrapped__(tmp_path)
    assert ds.y_train.tolist() == [a for a in range(6) for _ in range(12)]
    assert ds.y_test.tolist() == list(range(6))
    assert set(ds.writers_train.tolist()) == set(ds.writers_test.tolist()) == {3}


def _defect(kind: str) -> dict[str, np.ndarray] | bytes:
    arrays = _valid_arrays()
    if kind == "garbage":
        return b"not a zip archive"
    if kind == "missing":
        del arrays["recording"]
    elif kind == "channels":
        arrays["signals"] = arrays["signals"][:, :3]
    elif kind == "length":
        arrays["label"] = arrays["label"][:-1]
    elif kind == "nan":
        arrays["signals"][5, 2] = np.nan
    elif kind == "order":
        arrays["sample_index"][100:] += 1
    elif kind == "label":
        arrays["label"][0] = 13
    elif kind == "objects":
        arrays["user"] = np.array([3] * len(arrays["user"]), dtype=object)
    elif kind == "unlabelled":
        arrays["label"][:] = -1
    return arrays


@pytest.mark.parametrize(("kind", "needle"), [
    ("garbage", "not an npz (zip) archive"), ("missing", "missing array 'recording'"),
    ("channels", "expected float (N, 6)"), ("length", "one integer per sample"),
    ("nan", "NaN"), ("order", "time order"), ("label", "label outside"),
    ("objects", "Python objects, refused unread"), ("unlabelled", "no 128-sample window"),
])
def test_malformed_file_is_one_data_error_line(tmp_path: Path, kind: str, needle: str) -> None:
    content = _defect(kind)
    if isinstance(content, bytes):
        _npz(tmp_path).parent.mkdir(parents=True)
        _npz(tmp_path).write_bytes(content)
    else:
        _save(tmp_path, content)
    with pytest.raises(DataError) as err:
        D.load_har.__wrapped__(tmp_path)
    message = str(err.value)
    assert "\n" not in message and str(_npz(tmp_path)) in message and needle in message


def test_missing_file_says_where_and_how(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"hapt_raw_signals\.npz not found in .*har_hapt.*data "
                                        r"README") as err:
        D.load_har.__wrapped__(tmp_path)
    assert "\n" not in str(err.value)
