"""Exercise 171's tests: each takes the learner's module and checks its behaviour."""

from __future__ import annotations

import random


def model_sizes(max_bs: int) -> list[int]:
    """The captured sizes, written out the long way."""
    sizes = []
    for bs in range(1, max_bs + 1):
        if bs in (1, 2, 4) or bs % 8 == 0:
            sizes.append(bs)
    return sizes


def model_padded(sizes: list[int], batch_size: int) -> int | None:
    fits = [s for s in sizes if s >= batch_size]
    return min(fits) if fits else None


def test_small_maxima(solution):
    expected = {
        0: [],
        1: [1],
        2: [1, 2],
        3: [1, 2],
        4: [1, 2, 4],
        7: [1, 2, 4],
        8: [1, 2, 4, 8],
        9: [1, 2, 4, 8],
        23: [1, 2, 4, 8, 16],
    }
    for max_bs, sizes in expected.items():
        got = solution.graph_batch_sizes(max_bs)
        assert got == sizes, f"graph_batch_sizes({max_bs}) should be {sizes}, not {got}"


def test_every_maximum_up_to_300(solution):
    for max_bs in range(301):
        got = solution.graph_batch_sizes(max_bs)
        assert list(got) == model_sizes(max_bs), (
            f"graph_batch_sizes({max_bs}) should be {model_sizes(max_bs)}, not {got}"
        )


def test_256_gives_35_graphs(solution):
    sizes = solution.graph_batch_sizes(256)
    assert len(sizes) == 35, f"a maximum of 256 gives 35 sizes, not {len(sizes)}"
    assert sizes[-1] == 256, f"the largest size is 256 itself, not {sizes[-1]}"


def test_examples_of_padding(solution):
    sizes = [1, 2, 4, 8, 16]
    for batch, want in [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (13, 16), (16, 16), (17, None)]:
        got = solution.padded_size(sizes, batch)
        assert got == want, f"padded_size({sizes}, {batch}) should be {want}, not {got}"


def test_no_size_fits(solution):
    assert solution.padded_size([], 1) is None, "an empty list of sizes holds no batch"
    assert solution.padded_size([1, 2, 4], 5) is None, "no size holds 5 rows in [1, 2, 4]"


def test_padding_around_every_maximum(solution):
    for max_bs in (1, 2, 4, 8, 24, 100, 256):
        sizes = model_sizes(max_bs)
        for batch in range(1, max_bs + 10):
            got = solution.padded_size(list(sizes), batch)
            want = model_padded(sizes, batch)
            assert got == want, (
                f"padded_size(sizes up to {max_bs}, {batch}) should be {want}, not {got}"
            )


def test_other_ascending_lists(solution):
    rng = random.Random(171)
    for _ in range(300):
        sizes = sorted(rng.sample(range(1, 200), rng.randint(1, 12)))
        batch = rng.randint(1, 210)
        got = solution.padded_size(list(sizes), batch)
        want = model_padded(sizes, batch)
        assert got == want, f"padded_size({sizes}, {batch}) should be {want}, not {got}"


def test_sizes_are_left_as_they_were(solution):
    sizes = [1, 2, 4, 8, 16, 24]
    solution.padded_size(sizes, 13)
    assert sizes == [1, 2, 4, 8, 16, 24], f"padded_size changed its list: {sizes}"


def test_at_most_7_dummy_rows_up_to_256(solution):
    sizes = solution.graph_batch_sizes(256)
    worst = max(solution.padded_size(sizes, batch) - batch for batch in range(1, 257))
    assert worst == 7, (
        f"with a maximum of 256 the most dummy rows a batch carries is 7, not {worst}"
    )
