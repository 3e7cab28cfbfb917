"""A name -> entry registry: one list of allowed values per concept (draft kinds, tuner objectives, ...).

Adding a kind is one `register` call (plus its `conf/` file); every config check and
dispatch reads the registry, so nothing else lists the names. Import-light on purpose:
configs validate against registries before torch or transformers load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries by name, in registration order; `get` fails naming the field, the value and the choices."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove an entry (tests register toy kinds and take them back)."""
        self._entries.pop(name, None)

    def decorator(self, name: str) -> Callable[[T], T]:
        return lambda entry: self.register(name, entry)

    def get(self, name: str, field: str | None = None) -> T:
        if name not in self._entries:
            raise ValueError(f"{field or self.what}={name!r}: must be one of {self.names()}")
        return self._entries[name]

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)
