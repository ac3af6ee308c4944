"""A tiny name -> object registry, so configs name components and nothing switches on strings."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from fedflock.errors import ConfigError

T = TypeVar("T")


def _origin(obj: object) -> tuple[str, str]:
    """Where an object was defined: a module imported again (a plugin file loaded twice)
    re-registers its own entries instead of clashing with them."""
    return getattr(obj, "__module__", ""), getattr(obj, "__qualname__", repr(obj))


def first_sentence(doc: str) -> str:
    """A docstring's first sentence on one line (its first paragraph when no sentence ends
    there): a description cut at the end of a line stopped mid-sentence."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[:end + 1]


class Registry(Generic[T]):
    """Maps names to components; each entry keeps a one-line description for `fedflock list`."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._docs: dict[str, str] = {}

    def register(self, name: str, doc: str | None = None) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items and _origin(self._items[name]) != _origin(obj):
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj
            self._docs[name] = doc or first_sentence(getattr(obj, "__doc__", None) or "")
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items))
            raise ConfigError(f"unknown {self.kind} {name!r} (expected one of: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def describe(self) -> dict[str, str]:
        return {name: self._docs[name] for name in sorted(self._items)}
