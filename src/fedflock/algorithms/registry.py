"""The algorithm registry (kept apart so algorithm modules can register without cycles)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedflock.registry import Registry

if TYPE_CHECKING:
    from fedflock.algorithms.base import Algorithm

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")
