from __future__ import annotations


def give_pages(
    row: list[int], cached_len: int, device_len: int, free_pages: list[int], page_size: int
) -> tuple[list[int], list[int]]:
    """(the row with slots for positions [cached_len, device_len), the free pages left)."""
    raise NotImplementedError
