"""One node's share of a federation: its own client's data, without everyone else's.

A node of a deployment (a Flower SuperNode starts one ClientApp process per message) needs one
partition. Where it comes from:

* a scenario (simulation, loopback, a LAN test bed): the scenario can only be drawn for the
  whole federation at once (clients take from shared pools in turn), so it is drawn once and
  every partition is written to a node-local cache; every later message loads its own file.
  A cache file is keyed by the resolved data config (with the data root), the seed and the
  partition id; it is written atomically, read without pickle (`numpy.load(allow_pickle=False)`)
  and rebuilt with a warning when it is damaged. Nodes sharing a cache folder build it once
  between them (a file lock), not once each. A changed dataset file under the same root is not
  detected: clear the folder (`$FEDFLOCK_CACHE/partitions`) after replacing data.
* a device's own files (`load_node_files`): no scenario and no hidden group.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedflock.config import DataConfig
from fedflock.data.scenarios import ClientData, FederatedData, build_federated_data
from fedflock.data.spec import DataSpec
from fedflock.errors import DataError
from fedflock.fileio import atomic_open

CACHE_FORMAT = 2  # bump when what a cache file holds changes
ARRAYS = ("x_train", "y_train", "x_test", "y_test")


class PartitionCacheWarning(UserWarning):
    """A cache file could not be read; the partition is rebuilt."""


@dataclass
class NodeData:
    """What one node holds: its client's data, the data description every node must agree on,
    the size of the federation, the hidden group (None where nobody knows it), the
    training-set size of every client (differential privacy calibrates its noise on the
    smallest; a node that does not know the others' sizes has only its own) and, for text,
    the JSON of the tokenizer its token ids come from (the run keeps it for new clients)."""

    partition: int
    client: ClientData
    spec: DataSpec
    num_clients: int
    group: int | None
    sizes: tuple[int, ...]
    tokenizer: str | None = None

    def held(self) -> dict[int, ClientData]:
        return {self.partition: self.client}

    def group_of(self, client: int) -> int | None:
        return self.group if client == self.partition else None

    @classmethod
    def of(cls, data: FederatedData, partition: int,
           sizes: tuple[int, ...] | None = None) -> NodeData:
        return cls(partition, data.clients[partition], data.spec, len(data.clients),
                   int(data.groups[partition]), data.sizes if sizes is None else sizes,
                   data.tokenizer)


def default_cache_dir() -> Path:
    root = os.environ.get("FEDFLOCK_CACHE", Path.home() / ".cache" / "fedflock")
    return Path(root) / "partitions"


def _code_stamp() -> str:
    """The code that draws a federation: a fedflock whose scenarios changed draws anew."""
    from fedflock.data import datasets, scenarios, text

    digest = hashlib.sha256()
    for module in (scenarios, datasets, text):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


def cache_key(cfg: DataConfig, seed: int) -> str:
    """Names the federation a scenario draws: the data config, where its data root resolves
    to, the seed, the code that draws it and the cache format."""
    raw = {"data": cfg.model_dump(mode="json"), "root": str(cfg.resolved_root() or ""),
           "seed": seed, "code": _code_stamp(), "format": CACHE_FORMAT}
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:24]


def _path(folder: Path, dataset: str, key: str, partition: int) -> Path:
    return folder / f"{dataset}-{key}-p{partition}.npz"


def _write(path: Path, node: NodeData, key: str) -> None:
    meta = {"format": CACHE_FORMAT, "key": key, "partition": node.partition,
            "num_clients": node.num_clients, "group": node.group, "sizes": list(node.sizes),
            "spec": node.spec.to_dict(), "tokenizer": node.tokenizer}
    arrays = {name: getattr(node.client, name).numpy() for name in ARRAYS}
    with atomic_open(path, "wb", durable=False) as fh:
        np.savez(fh, meta=np.array(json.dumps(meta)), **arrays)


def _read(path: Path, key: str | None = None) -> NodeData:
    """A cache file (or a node's own `.npz`); raises ValueError saying what is wrong."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"not a readable .npz ({type(err).__name__}: {err})") from None
    if "meta" not in arrays or not all(name in arrays for name in ARRAYS):
        raise ValueError(f"holds {sorted(arrays)}, not meta + {', '.join(ARRAYS)}")
    try:
        meta = json.loads(str(arrays["meta"]))
        if key is not None and meta.get("key") != key:
            raise ValueError("written for another federation")
        spec = DataSpec.from_dict(meta["spec"])
        node = NodeData(int(meta["partition"]), _client(arrays), spec, int(meta["num_clients"]),
                        None if meta["group"] is None else int(meta["group"]),
                        tuple(int(n) for n in meta["sizes"]), meta.get("tokenizer"))
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"unreadable description ({type(err).__name__}: {err})") from None
    return node


def _client(arrays: dict[str, np.ndarray]) -> ClientData:
    return ClientData(*(torch.from_numpy(np.ascontiguousarray(arrays[n])) for n in ARRAYS))


@contextlib.contextmanager
def _locked(folder: Path, key: str):
    """One builder at a time per federation among the processes sharing `folder`."""
    with open(folder / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def scenario_partition(cfg: DataConfig, seed: int, partition: int,
                       cache_dir: Path | None = None) -> NodeData:
    """Partition `partition` of the scenario `cfg` draws with `seed`, from the node-local cache
    when it holds it; otherwise the federation is drawn once and every partition cached."""
    if not 0 <= partition < cfg.clients:
        raise DataError(f"partition-id {partition} is outside 0..{cfg.clients - 1}")
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = cache_key(cfg, seed)
    path = _path(folder, cfg.dataset, key, partition)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _locked(folder, key):
            if path.is_file():
                try:
                    return _read(path, key)
                except ValueError as err:
                    warnings.warn(f"partition cache {path}: {err}; rebuilding it",
                                  PartitionCacheWarning, stacklevel=2)
            data = build_federated_data(cfg, seed)
            sizes = data.sizes
            for index in range(len(data.clients)):
                _write(_path(folder, cfg.dataset, key, index), NodeData.of(data, index, sizes),
                       key)
        return NodeData.of(data, partition, sizes)
    except OSError as err:  # a cache that cannot be written: still works, drawing each time
        warnings.warn(f"partition cache {folder}: {err}; drawing the federation for this "
                      "message", PartitionCacheWarning, stacklevel=2)
        return NodeData.of(build_federated_data(cfg, seed), partition)


def load_node_files(path: Path, partition: int, num_clients: int) -> NodeData:
    """A device's own data: an `.npz` holding `x`, `y`, `x_test`, `y_test` (inputs float or
    integer token ids, labels integers 0..C-1; for token ids, labels shaped as the inputs are
    next-token targets and the objective is `next_token`), `num_classes` (optional: default
    the largest label + 1, or the vocabulary for next tokens, but every node must agree on it,
    so give it) and, for token ids, `vocab_size` and optionally `tokenizer` (the JSON of the
    `tokenizers` tokenizer that cut them, as a string: the run keeps it for new clients).
    Raises DataError with one line saying what is wrong."""
    path = Path(path)
    where = f"data-path {path}"
    if not path.is_file():
        raise DataError(f"{where}: no such file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(f"{where}: not a readable .npz ({type(err).__name__}: {err})") from None
    missing = [n for n in ("x", "y", "x_test", "y_test") if n not in arrays]
    if missing:
        raise DataError(f"{where}: missing array(s) {', '.join(missing)} (it holds "
                        f"{', '.join(sorted(arrays)) or 'nothing'})")
    x, y, x_test, y_test = (arrays[n] for n in ("x", "y", "x_test", "y_test"))
    tokens = x.dtype.kind in "iu"
    next_token = tokens and y.ndim == 2  # targets: the next token of every position
    for name, inputs, labels in (("x/y", x, y), ("x_test/y_test", x_test, y_test)):
        if len(inputs) != len(labels) or len(labels) == 0:
            raise DataError(f"{where}: {name} hold {len(inputs)} inputs and {len(labels)} "
                            "labels (need as many, at least one)")
        if labels.dtype.kind not in "iu":
            raise DataError(f"{where}: labels must be integers, not {labels.dtype}")
        if next_token and labels.shape != inputs.shape:
            raise DataError(f"{where}: next-token targets {name} must have the inputs' shape "
                            f"{list(inputs.shape)}, not {list(labels.shape)}")
        if not next_token and labels.ndim != 1:
            raise DataError(f"{where}: labels must be a 1-D integer array (or, for token "
                            f"ids, next-token targets shaped as the inputs), not "
                            f"{labels.dtype}{list(labels.shape)}")
        if inputs.dtype.kind not in "fiu":
            raise DataError(f"{where}: inputs of type {inputs.dtype} are not numbers")
    if x.shape[1:] != x_test.shape[1:]:
        raise DataError(f"{where}: x has samples of shape {list(x.shape[1:])}, x_test "
                        f"{list(x_test.shape[1:])}")
    if x.dtype.kind != x_test.dtype.kind:
        raise DataError(f"{where}: x is {x.dtype}, x_test {x_test.dtype}")
    if tokens and "vocab_size" not in arrays:
        raise DataError(f"{where}: integer inputs (token ids) need a 'vocab_size' array")
    vocab = int(arrays["vocab_size"]) if tokens else None
    if "num_classes" in arrays:
        classes = int(arrays["num_classes"])
    elif next_token:
        classes = vocab  # type: ignore[assignment]
    else:
        classes = int(max(y.max(), y_test.max())) + 1
    if min(y.min(), y_test.min()) < 0 or max(y.max(), y_test.max()) >= classes:
        raise DataError(f"{where}: labels must lie in 0..{classes - 1}")
    if tokens and (min(x.min(), x_test.min()) < 0 or max(x.max(), x_test.max()) >= vocab):
        raise DataError(f"{where}: token ids must lie in 0..{vocab - 1}")
    spec = DataSpec(tuple(int(s) for s in x.shape[1:]), classes,
                    "next_token" if next_token else "classification", vocab_size=vocab)
    to_torch = [torch.from_numpy(np.ascontiguousarray(a)) for a in (x, y, x_test, y_test)]
    inputs = [t.long() if tokens else t.float() for t in (to_torch[0], to_torch[2])]
    client = ClientData(inputs[0], to_torch[1].long(), inputs[1], to_torch[3].long())
    tokenizer = str(arrays["tokenizer"]) if tokens and "tokenizer" in arrays else None
    return NodeData(partition, client, spec, num_clients, None, (len(y),), tokenizer)
