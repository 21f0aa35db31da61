"""Breaks: take the pages from the front of free_pages, in order."""

from __future__ import annotations


def _div_ceil(a: int, b: int) -> int:
    return -(-a // b)


def give_pages(
    row: list[int], cached_len: int, device_len: int, free_pages: list[int], page_size: int
) -> tuple[list[int], list[int]]:
    """(the row with slots for positions [cached_len, device_len), the free pages left)."""
    first, last = _div_ceil(cached_len, page_size), _div_ceil(device_len, page_size)
    n = max(last - first, 0)
    if n > len(free_pages):
        raise RuntimeError(f"out of KV pages: {n} needed, {len(free_pages)} free")
    row = list(row)
    for j, page in enumerate(free_pages[::-1][:n]):
        start = (first + j) * page_size
        row[start : start + page_size] = [page * page_size + o for o in range(page_size)]
    return row, list(free_pages[: len(free_pages) - n])
