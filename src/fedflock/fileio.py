"""Writing files so that a crash never leaves half of one, and JSON that stays JSON.

Every file fedflock writes for a user (run directories, compare tables, assign results, the
dataset cache) goes through `atomic_open`: the bytes go to a temporary file beside the target,
are flushed to the disk (`fsync`), and only then renamed over the target, and the rename itself
is made durable by syncing the folder. A kill or a full disk at any moment leaves either the
old complete file or the new complete file, never a torn one.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def fsync_dir(folder: Path) -> None:
    """Make a rename inside `folder` durable (a no-op where folders cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextmanager
def atomic_open(path: Path, mode: str = "w", durable: bool = True) -> Iterator[IO[Any]]:
    """`with atomic_open(p, "wb") as fh: ...`: `p` appears complete or not at all. Without
    `durable` nothing is synced to the disk (a cache that is rebuilt when damaged: the rename
    alone keeps readers from a torn file, and syncing costs seconds on slow disks)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # concurrent writers never collide
    try:
        with open(tmp, mode) as fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        fsync_dir(path.parent)


def write_text(path: Path, text: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float as None: strict JSON has no NaN or Infinity (a
    diverged model's loss, a metric without samples)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def json_text(value: Any, indent: int | None = None) -> str:
    """Strict JSON (non-finite floats written as null)."""
    return json.dumps(json_safe(value), indent=indent, allow_nan=False)


def write_json(path: Path, value: Any) -> None:
    write_text(path, json_text(value, indent=2) + "\n")
