from __future__ import annotations


def schedule_prefill(
    waiting: list[dict],
    budget: int,
    available_pages: int,
    reserved_pages: int,
    free_rows: int,
    page_size: int,
) -> list[tuple[int, int, int]]:
    """The next prefill batch as (uid, start, end) chunks, in order of arrival."""
    raise NotImplementedError
