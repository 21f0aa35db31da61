"""Breaks: do not change the dicts."""

from __future__ import annotations


def _div_ceil(a: int, b: int) -> int:
    return -(-a // b)


def _pages_to_finish(req: dict, page_size: int) -> int:
    last_cached = req["prompt_len"] + req["max_tokens"] - 1  # the last token takes no slot
    return _div_ceil(last_cached, page_size) - _div_ceil(req["cached_len"], page_size)


def schedule_prefill(
    waiting: list[dict],
    budget: int,
    available_pages: int,
    reserved_pages: int,
    free_rows: int,
    page_size: int,
) -> list[tuple[int, int, int]]:
    """The next prefill batch as (uid, start, end) chunks, in order of arrival."""
    reserved = reserved_pages + sum(
        _pages_to_finish(r, page_size) for r in waiting if r["admitted"]
    )
    chunks = []
    for req in waiting:
        if budget <= 0:
            break
        if not req["admitted"]:
            needed = _pages_to_finish(req, page_size)
            if free_rows == 0 or needed + reserved > available_pages:
                break  # first come, first served: nobody overtakes it
            free_rows -= 1
            reserved += needed
        start = req["cached_len"]
        chunk = min(budget, req["prompt_len"] - start)
        chunks.append((req["uid"], start, start + chunk))
        req["admitted"] = True
        budget -= chunk
    return chunks
