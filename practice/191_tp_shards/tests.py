"""Exercise 191's tests: each takes the learner's module and checks its behaviour."""

from __future__ import annotations

import random


def model_range(vocab: int, rank: int, size: int) -> tuple[int, int, int]:
    """Count the rows up rank by rank: the long way."""
    rows = 0
    while rows * size < vocab:
        rows += 1
    start = 0
    for _ in range(rank):
        start = min(start + rows, vocab)
    return start, min(start + rows, vocab), rows


def matrix(rng: random.Random, rows: int, cols: int) -> list[list[float]]:
    return [[float(rng.randint(-9, 9)) for _ in range(cols)] for _ in range(rows)]


def matvec(m: list[list[float]], v: list[float]) -> list[float]:
    return [sum(a * b for a, b in zip(row, v)) for row in m]


def raises_value_error(call) -> bool:
    try:
        call()
    except ValueError:
        return True
    return False


def test_qwen3_vocabulary_over_two_ranks(solution):
    got = [tuple(solution.vocab_range(151936, r, 2)) for r in range(2)]
    want = [(0, 75968, 75968), (75968, 151936, 75968)]
    assert got == want, f"151,936 rows over 2 ranks: {want}, not {got}"


def test_padding_and_an_empty_rank(solution):
    got = [tuple(solution.vocab_range(5, r, 4)) for r in range(4)]
    want = [(0, 2, 2), (2, 4, 2), (4, 5, 2), (5, 5, 2)]
    assert got == want, (
        f"5 rows over 4 ranks: every rank holds 2, the last none of them: {want}, not {got}"
    )


def test_vocab_ranges_against_the_model(solution):
    for vocab in range(1, 40):
        for size in (1, 2, 3, 4, 8):
            for rank in range(size):
                got = tuple(solution.vocab_range(vocab, rank, size))
                want = model_range(vocab, rank, size)
                assert got == want, (
                    f"vocab_range({vocab}, {rank}, {size}) should be {want}, not {got}"
                )


def test_vocab_shards_stack_back_to_the_table(solution):
    rng = random.Random(191)
    for _ in range(60):
        vocab, width, size = rng.randint(1, 30), rng.randint(1, 4), rng.choice([1, 2, 3, 4, 8])
        table = matrix(rng, vocab, width)
        parts = [solution.shard(table, "vocab", r, size) for r in range(size)]
        rows = model_range(vocab, 0, size)[2]
        assert all(len(p) == rows for p in parts), (
            f"{vocab} rows over {size} ranks: every rank holds {rows} rows, not "
            f"{[len(p) for p in parts]}"
        )
        stacked = [row for p in parts for row in p]
        assert stacked[:vocab] == table, (
            f"the ranks' rows in rank order are the table ({vocab} rows over {size} ranks)"
        )
        assert all(v == 0 for row in stacked[vocab:] for v in row), "the padding rows are zeros"
        assert all(len(row) == width for row in stacked), f"every row has {width} columns"


def test_column_shards_split_the_output(solution):
    rng = random.Random(1911)
    for _ in range(60):
        size = rng.choice([1, 2, 4])
        out, cols = size * rng.randint(1, 4), rng.randint(1, 5)
        w, x = matrix(rng, out, cols), [float(rng.randint(-3, 3)) for _ in range(cols)]
        parts = [solution.shard(w, "column", r, size) for r in range(size)]
        assert [row for p in parts for row in p] == w, (
            f"column-parallel shards over {size} ranks, in rank order, are the rows of the weight"
        )
        gathered = [y for p in parts for y in matvec(p, x)]
        assert gathered == matvec(w, x), "each rank's outputs side by side are the full output"


def test_row_shards_split_the_input(solution):
    rng = random.Random(1912)
    for _ in range(60):
        size = rng.choice([1, 2, 4])
        out, cols = rng.randint(1, 5), size * rng.randint(1, 4)
        w, x = matrix(rng, out, cols), [float(rng.randint(-3, 3)) for _ in range(cols)]
        parts = [solution.shard(w, "row", r, size) for r in range(size)]
        width = cols // size
        assert all(len(p) == out and all(len(row) == width for row in p) for p in parts), (
            f"a row-parallel shard keeps the {out} rows and takes {width} of {cols} columns"
        )
        rejoined = [[v for p in parts for v in p[i]] for i in range(out)]
        assert rejoined == w, "the ranks' columns side by side are the weight"
        partial = [matvec(p, x[r * width : (r + 1) * width]) for r, p in enumerate(parts)]
        summed = [sum(ys) for ys in zip(*partial)]
        assert summed == matvec(w, x), (
            "the all-reduce (a sum) of the partial outputs is the full output"
        )


def test_whole_is_a_copy(solution):
    w = [[1.0, 2.0], [3.0, 4.0]]
    for rank in range(2):
        got = solution.shard(w, "whole", rank, 2)
        assert got == w, f"a norm or router stays whole on every rank: {w}, not {got}"
        got[0][0] = 9.0
        assert w == [[1.0, 2.0], [3.0, 4.0]], "shard gave back the weight's own rows, not a copy"


def test_uneven_splits_are_errors(solution):
    w = [[1.0, 2.0, 3.0]] * 3
    assert raises_value_error(lambda: solution.shard(w, "column", 0, 2)), (
        "3 output rows over 2 ranks is a ValueError, not a guess"
    )
    assert raises_value_error(lambda: solution.shard(w, "row", 1, 2)), (
        "3 input columns over 2 ranks is a ValueError, not a guess"
    )
    got = solution.shard(w, "vocab", 1, 2)
    assert got == [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], (
        f"the vocabulary pads instead: rank 1 of 2 holds its row and a zero row, not {got}"
    )


def test_shards_are_copies(solution):
    w = [[1.0, 2.0], [3.0, 4.0]]
    for kind in ("column", "row", "vocab"):
        part = solution.shard(w, kind, 0, 2)
        part[0][0] = 9.0
        assert w == [[1.0, 2.0], [3.0, 4.0]], f"changing the {kind} shard changed the weight"
