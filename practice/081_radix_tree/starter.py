from __future__ import annotations


class RadixCache:
    """Cached token sequences in one tree; every edge holds whole pages of tokens and slots."""

    def __init__(self, page_size: int):
        raise NotImplementedError

    def match(self, ids: list[int]) -> list[int]:
        """The slots of the longest cached prefix of ids, in whole pages (splitting an edge that
        the match ends inside)."""
        raise NotImplementedError

    def insert(self, ids: list[int], slots: list[int]) -> int:
        """Cache ids cut to whole pages; return how many tokens were cached already."""
        raise NotImplementedError

    def edges(self) -> list[tuple[int, ...]]:
        """The key of every node but the root, sorted."""
        raise NotImplementedError
