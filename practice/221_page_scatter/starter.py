"""Exercise 221: where a step's new pages go in the page table, then one scatter of their slots."""

from __future__ import annotations


def new_page_starts(spans: list[tuple[int, int, int]], page_size: int, width: int) -> list[int]:
    """The flat page-table index of every new page's first entry, for requests (row,
    cached_len, device_len) in batch order, each request's pages in page order."""
    raise NotImplementedError


def scatter(starts: list[int], pages: list[int], page_size: int) -> tuple[list[int], list[int]]:
    """(where, values): page i's page_size entries from starts[i] get the slots of pages[i]."""
    raise NotImplementedError
