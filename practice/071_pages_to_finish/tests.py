import random


def _model(prompt_len, max_tokens, cached_len, page_size):
    pages = set()
    for pos in range(prompt_len + max_tokens - 1):
        pages.add(pos // page_size)
    held = {pos // page_size for pos in range(cached_len)}
    return len(pages - held)


def _check(solution, args):
    got = solution.pages_to_finish(*args)
    want = _model(*args)
    assert got == want, f"pages_to_finish{args}: got {got!r}, expected {want}"


def test_examples(solution):
    for args in [(5, 4, 0, 4), (5, 4, 5, 4), (1, 1, 0, 16)]:
        _check(solution, args)


def test_last_token_takes_no_slot(solution):
    _check(solution, (4, 1, 0, 4))  # 4 cached tokens at most: one page, not two
    _check(solution, (4, 5, 0, 4))  # 8: two pages


def test_partly_filled_page_is_held(solution):
    _check(solution, (10, 10, 5, 4))
    _check(solution, (10, 10, 8, 4))
    _check(solution, (10, 10, 9, 4))


def test_page_size_one(solution):
    _check(solution, (7, 3, 0, 1))
    _check(solution, (7, 3, 7, 1))


def test_nothing_left(solution):
    _check(solution, (6, 3, 8, 4))


def test_random(solution):
    rng = random.Random(71)
    for _ in range(300):
        page_size = rng.choice([1, 2, 4, 16])
        prompt, max_tokens = rng.randint(1, 40), rng.randint(1, 40)
        cached = rng.randint(0, prompt + max_tokens - 1)
        _check(solution, (prompt, max_tokens, cached, page_size))
