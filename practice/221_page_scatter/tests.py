"""Exercise 221's tests: each takes the learner's module and checks its behaviour."""

from __future__ import annotations

import random


def loop_table(spans: list, page_size: int, width: int, free: list[int]) -> tuple[list, int]:
    """Chapter 7's way, written out: every request, every new position; a position whose page
    the row lacks takes the next free page. The table (-1: no slot) and the pages taken."""
    table = [-1] * (width * (1 + max(row for row, _, _ in spans)))
    held: dict = {}  # (row, page index) -> page
    taken = 0
    for row, cached_len, device_len in spans:
        for p in range(cached_len // page_size, (cached_len - 1) // page_size + 1):
            held[row, p] = None  # the page of positions before cached_len: already the row's
        for position in range(cached_len, device_len):
            index = position // page_size
            if (row, index) not in held:
                held[row, index] = free[taken]
                taken += 1
                for j in range(page_size):
                    table[row * width + index * page_size + j] = free[taken - 1] * page_size + j
    return table, taken


def solved_table(solution, spans: list, page_size: int, width: int, free: list[int]) -> list:
    starts = solution.new_page_starts([tuple(s) for s in spans], page_size, width)
    starts = list(starts)
    assert len(starts) <= len(free), f"{len(starts)} new pages for spans {spans}: too many"
    where, values = solution.scatter(list(starts), free[: len(starts)], page_size)
    where, values = list(where), list(values)
    assert len(where) == len(values) == len(starts) * page_size, (
        f"scatter gives {len(where)} positions and {len(values)} slots for {len(starts)} pages "
        f"of {page_size}"
    )
    table = [-1] * (width * (1 + max(row for row, _, _ in spans)))
    for w, v in zip(where, values):
        assert 0 <= w < len(table), f"position {w} is outside a page table of {len(table)}"
        table[w] = v
    return table


def check(solution, spans: list, page_size: int, width: int, what: str) -> None:
    free = list(range(1000, 1000 + sum(e - s for _, s, e in spans) + len(spans)))[::-1]
    want, taken = loop_table(spans, page_size, width, free)
    starts = list(solution.new_page_starts([tuple(s) for s in spans], page_size, width))
    assert len(starts) == taken, (
        f"{what}: spans {spans} at pages of {page_size} take {taken} new pages, not {len(starts)}"
    )
    got = solved_table(solution, spans, page_size, width, free)
    for row in range(len(want) // width):
        w, g = want[row * width : (row + 1) * width], got[row * width : (row + 1) * width]
        assert g == w, (
            f"{what}: spans {spans}, pages of {page_size}: row {row} should be {w}, not {g}"
        )


def test_the_statements_example(solution):
    starts = list(solution.new_page_starts([(0, 0, 6), (1, 5, 6), (2, 6, 9)], 4, 12))
    assert starts == [0, 4, 32], f"new_page_starts of the example is [0, 4, 32], not {starts}"
    where, values = solution.scatter([0, 4, 32], [7, 3, 9], 4)
    assert list(where) == [0, 1, 2, 3, 4, 5, 6, 7, 32, 33, 34, 35], f"where: {where}"
    assert list(values) == [28, 29, 30, 31, 12, 13, 14, 15, 36, 37, 38, 39], f"values: {values}"


def test_page_boundaries(solution):
    check(
        solution,
        [(0, 4, 5), (1, 3, 4), (2, 4, 8), (3, 7, 9)],
        4,
        16,
        "spans starting or ending on a page boundary",
    )
    check(solution, [(0, 0, 4), (1, 8, 12), (2, 0, 1)], 4, 16, "whole pages")


def test_spans_with_no_new_position(solution):
    check(solution, [(0, 5, 5), (1, 0, 0), (2, 3, 4)], 4, 8, "empty spans")


def test_pages_of_one_slot(solution):
    check(solution, [(0, 0, 3), (2, 7, 8), (1, 2, 6)], 1, 10, "pages of one slot")


def test_a_long_prefill_beside_decodes(solution):
    check(
        solution,
        [(3, 0, 77), (0, 16, 17), (1, 15, 16), (2, 31, 33)],
        16,
        96,
        "a long prefill beside decodes",
    )


def test_rows_wider_than_the_spans(solution):
    check(solution, [(0, 2, 9), (4, 0, 3), (2, 6, 13)], 4, 1000, "rows of 1,000 entries")


def test_random_batches(solution):
    rng = random.Random(221)
    for _ in range(300):
        page_size, width = rng.choice([1, 2, 4, 16]), rng.choice([32, 64, 96])  # whole pages
        rows = rng.sample(range(12), rng.randint(1, 8))
        spans = []
        for row in rows:
            cached = rng.randint(0, width - 1)
            spans.append((row, cached, min(width, cached + rng.choice([0, 1, 1, 2, 7, 20]))))
        check(solution, spans, page_size, width, "a random batch")


def test_inputs_unchanged(solution):
    spans = [(0, 1, 9), (1, 4, 5)]
    kept = list(spans)
    starts = solution.new_page_starts(spans, 4, 16)
    assert spans == kept, "new_page_starts changed its spans"
    starts, pages = list(starts), [5, 6, 7]
    solution.scatter(starts, pages, 4)
    assert pages == [5, 6, 7] and starts == [4, 8, 20], "scatter changed its inputs"
