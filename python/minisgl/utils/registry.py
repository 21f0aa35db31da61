from __future__ import annotations

from typing import Dict, Generic, List, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Names to things: Hugging Face architecture names to model classes, say.

    ``get`` of an unknown name is a clear error that lists the names it knows.
    """

    def __init__(self, kind: str):
        self.kind = kind  # what the names name, for error messages: "model architecture"
        self._entries: Dict[str, T] = {}

    def register(self, name: str, value: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = value
        return value

    def get(self, name: str) -> T:
        if name not in self._entries:
            known = ", ".join(self.names())
            raise ValueError(f"unknown {self.kind} {name!r}; known: {known}")
        return self._entries[name]

    def names(self) -> List[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
