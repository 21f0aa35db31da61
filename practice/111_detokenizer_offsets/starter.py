from __future__ import annotations

from typing import Callable


class IncrementalDecoder:
    """One request's text, streamed as its ids arrive; never half a character."""

    def __init__(self, decode: Callable[[list[int]], str]):
        raise NotImplementedError

    def feed(self, new_ids: list[int], finished: bool = False) -> str:
        """The text that became final with new_ids ("" if none)."""
        raise NotImplementedError
