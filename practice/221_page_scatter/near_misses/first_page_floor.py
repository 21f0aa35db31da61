"""Breaks: a span that starts mid-page already holds that page."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def new_page_starts(spans: list[tuple[int, int, int]], page_size: int, width: int) -> list[int]:
    """The flat page-table index of every new page's first entry, for requests (row,
    cached_len, device_len) in batch order, each request's pages in page order."""
    starts = []
    for row, cached_len, device_len in spans:
        # the page that holds position cached_len is already the row's unless it starts there
        first, last = cached_len // page_size, cdiv(device_len, page_size)
        starts += range(row * width + first * page_size, row * width + last * page_size, page_size)
    return starts


def scatter(starts: list[int], pages: list[int], page_size: int) -> tuple[list[int], list[int]]:
    """(where, values): page i's page_size entries from starts[i] get the slots of pages[i]."""
    where = [start + j for start in starts for j in range(page_size)]
    values = [page * page_size + j for page in pages for j in range(page_size)]
    return where, values
