import copy
import random


def _model(waiting, budget, available, reserved, rows, page_size):
    def need(r):
        total = r["prompt_len"] + r["max_tokens"] - 1
        held = r["cached_len"]
        return (total + page_size - 1) // page_size - (held + page_size - 1) // page_size

    reserved += sum(need(r) for r in waiting if r["admitted"])
    out = []
    i = 0
    while i < len(waiting) and budget > 0:
        r = waiting[i]
        if not r["admitted"]:
            if rows < 1 or reserved + need(r) > available:
                return out
            rows, reserved = rows - 1, reserved + need(r)
        n = min(budget, r["prompt_len"] - r["cached_len"])
        out.append((r["uid"], r["cached_len"], r["cached_len"] + n))
        budget -= n
        i += 1
    return out


def _req(uid, prompt, max_tokens, cached=0, admitted=False):
    return {
        "uid": uid,
        "prompt_len": prompt,
        "max_tokens": max_tokens,
        "cached_len": cached,
        "admitted": admitted,
    }


def _check(solution, waiting, budget, available, reserved, rows, page_size, what):
    before = copy.deepcopy(waiting)
    got = solution.schedule_prefill(waiting, budget, available, reserved, rows, page_size)
    want = _model(before, budget, available, reserved, rows, page_size)
    got = [tuple(c) for c in got]
    assert got == want, (
        f"{what}: got {got}, expected {want}\n  waiting={before}, budget="
        f"{budget}, available={available}, reserved={reserved}, rows={rows}, "
        f"page_size={page_size}"
    )
    assert waiting == before, f"{what}: the request dicts were changed"


def test_readme_example(solution):
    _check(solution, [_req("A", 10, 6), _req("B", 3, 2)], 8, 10, 2, 4, 4, "README example")


def test_next_chunk_of_admitted(solution):
    waiting = [_req("A", 10, 6, cached=8, admitted=True), _req("B", 3, 2)]
    _check(solution, waiting, 8, 10, 2, 4, 4, "A's last 2 tokens, then B")


def test_budget_shared_in_order(solution):
    waiting = [_req(1, 3, 1), _req(2, 4, 1), _req(3, 5, 1)]
    _check(solution, waiting, 9, 100, 0, 8, 1, "the third request gets what is left")


def test_no_overtaking(solution):
    waiting = [_req("big", 30, 30), _req("small", 2, 1)]
    _check(solution, waiting, 64, 10, 0, 4, 4, "the big request does not fit: nobody runs")


def test_admitted_reserve_pages(solution):
    waiting = [_req("A", 16, 16, cached=8, admitted=True), _req("B", 4, 4)]
    _check(solution, waiting, 100, 10, 0, 4, 4, "A's reservation leaves no room for B")
    _check(solution, waiting, 100, 11, 0, 4, 4, "one page more and B fits")


def test_rows(solution):
    waiting = [_req(1, 2, 2), _req(2, 2, 2), _req(3, 2, 2)]
    _check(solution, waiting, 100, 100, 0, 2, 2, "two free rows, three requests")
    _check(solution, waiting, 100, 100, 0, 0, 2, "no free row")


def test_cached_prefix(solution):
    waiting = [_req("A", 12, 4, cached=8)]
    _check(solution, waiting, 100, 2, 0, 1, 4, "a matched prefix: fewer pages to take")


def test_random(solution):
    rng = random.Random(91)
    for case in range(200):
        page_size = rng.choice([1, 2, 4])
        waiting = []
        for uid in range(rng.randint(0, 6)):
            prompt = rng.randint(1, 40)
            admitted = uid < 2 and rng.random() < 0.5
            cached = rng.randint(0, prompt - 1)
            waiting.append(_req(uid, prompt, rng.randint(1, 20), cached, admitted))
        _check(
            solution,
            waiting,
            rng.randint(0, 60),
            rng.randint(0, 60),
            rng.randint(0, 10),
            rng.randint(0, 4),
            page_size,
            f"random case {case}",
        )
