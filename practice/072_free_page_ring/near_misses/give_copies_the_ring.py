"""Breaks: giving n pages costs O(n) however large the pool: write into ring."""

from __future__ import annotations


class PageRing:
    """The free pages as a queue in one fixed list: taken at the head, given back at the tail."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self.ring = list(range(num_pages))
        self.head = 0  # the ring's index of the next page to hand out
        self.num_free = num_pages

    def take(self, n: int) -> list[int]:
        if n > self.num_free:
            raise RuntimeError(f"out of pages: {n} needed, {self.num_free} free")
        pages = [self.ring[i] for i in self._index(self.head, n)]
        self.head = (self.head + n) % self.num_pages
        self.num_free -= n
        return pages

    def give(self, pages: list[int]) -> None:
        ring = list(self.ring)  # a fresh copy, the old one left as it was
        for i, page in zip(self._index(self.head + self.num_free, len(pages)), pages):
            ring[i] = page
        self.ring = ring
        self.num_free += len(pages)

    def free_pages(self) -> list[int]:
        return [self.ring[i] for i in self._index(self.head, self.num_free)]

    def _index(self, start: int, n: int) -> list[int]:
        """Positions start, start + 1, ..., start + n - 1 of the ring, wrapped around."""
        return [(start + j) % self.num_pages for j in range(n)]
