from __future__ import annotations


class PageRing:
    """The free pages as a queue in one fixed list: taken at the head, given back at the tail."""

    def __init__(self, num_pages: int):
        raise NotImplementedError

    def take(self, n: int) -> list[int]:
        raise NotImplementedError

    def give(self, pages: list[int]) -> None:
        raise NotImplementedError

    def free_pages(self) -> list[int]:
        raise NotImplementedError
