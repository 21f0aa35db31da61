import random


def _model(row, cached, device, free, size):
    row, free = list(row), list(free)
    for pos in range(cached, device):
        if pos % size == 0:  # the first position of a page not held yet
            if not free:
                raise RuntimeError("out of pages")
            page = free.pop(0)
            for o in range(size):
                row[pos - pos % size + o] = page * size + o
    return row, free


def _check(solution, row, cached, device, free, size, what):
    args = (list(row), cached, device, list(free), size)
    got = solution.give_pages(*args)
    want = _model(row, cached, device, free, size)
    got = (list(got[0]), list(got[1]))
    assert got == want, (
        f"{what}: give_pages(row, {cached}, {device}, {free}, {size}) returned "
        f"{got}, expected {want}"
    )
    assert (args[0], args[3]) == (row, free), f"{what}: the inputs were changed"
    return got


def test_example(solution):
    row, free = _check(solution, [0] * 12, 0, 5, [5, 2, 7], 4, "README example")
    _check(solution, row, 5, 6, free, 4, "a step inside a held page")


def test_step_onto_new_page(solution):
    row, free = _check(solution, [0] * 12, 0, 4, [3, 1, 2], 4, "a prompt of exactly one page")
    _check(solution, row, 4, 5, free, 4, "position 4 needs the next page")


def test_page_size_one(solution):
    _check(solution, [0] * 6, 2, 5, [9, 8, 7, 6], 1, "page size 1")


def test_out_of_pages(solution):
    try:
        solution.give_pages([0] * 12, 0, 9, [1, 2], 4)
    except NotImplementedError:
        raise
    except RuntimeError:
        return
    raise AssertionError("9 positions need 3 pages of 4, only 2 free: expected RuntimeError")


def test_random_steps(solution):
    rng = random.Random(51)
    for case in range(40):
        size = rng.choice([1, 2, 4, 8])
        pages = list(range(12))
        rng.shuffle(pages)
        row, free, cached = [-1] * (12 * size), pages, 0
        while cached < 12 * size:
            device = min(12 * size, cached + rng.choice([1, 1, 2, 3, size * 2]))
            row, free = _check(
                solution,
                row,
                cached,
                device,
                free,
                size,
                f"random case {case}, positions {cached}..{device - 1}",
            )
            cached = device
