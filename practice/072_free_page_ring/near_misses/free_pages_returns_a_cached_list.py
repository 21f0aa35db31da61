"""Breaks: free_pages(): the free pages in queue order (a new list)."""

from __future__ import annotations


class PageRing:
    """The free pages as a queue in one fixed list: taken at the head, given back at the tail."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self.ring = list(range(num_pages))
        self.head = 0  # the ring's index of the next page to hand out
        self.num_free = num_pages
        self.cached: list[int] | None = None  # free_pages() until the next take or give

    def take(self, n: int) -> list[int]:
        if n > self.num_free:
            raise RuntimeError(f"out of pages: {n} needed, {self.num_free} free")
        pages = [self.ring[i] for i in self._index(self.head, n)]
        self.head = (self.head + n) % self.num_pages
        self.num_free -= n
        self.cached = None
        return pages

    def give(self, pages: list[int]) -> None:
        for i, page in zip(self._index(self.head + self.num_free, len(pages)), pages):
            self.ring[i] = page
        self.num_free += len(pages)
        self.cached = None

    def free_pages(self) -> list[int]:
        if self.cached is None:
            self.cached = [self.ring[i] for i in self._index(self.head, self.num_free)]
        return self.cached

    def _index(self, start: int, n: int) -> list[int]:
        """Positions start, start + 1, ..., start + n - 1 of the ring, wrapped around."""
        return [(start + j) % self.num_pages for j in range(n)]
