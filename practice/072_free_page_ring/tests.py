import random
from collections import deque


def _same(ring, queue, what):
    got = list(ring.free_pages())
    assert got == list(queue), f"{what}: free_pages() is {got}, expected {list(queue)}"
    assert ring.num_free == len(queue), (
        f"{what}: num_free is {ring.num_free}, expected {len(queue)}")


def test_readme_example(solution):
    ring = solution.PageRing(4)
    assert list(ring.take(3)) == [0, 1, 2], "take(3) from a new ring of 4"
    ring.give([1])
    ring.give([0])
    got = list(ring.take(3))
    assert got == [3, 1, 0], f"take(3) after giving 1 then 0: got {got}, expected [3, 1, 0]"
    _same(ring, deque(), "all taken")


def test_initial(solution):
    _same(solution.PageRing(5), deque(range(5)), "a new ring")


def test_too_many(solution):
    ring = solution.PageRing(3)
    ring.take(2)
    try:
        ring.take(2)
    except NotImplementedError:
        raise
    except RuntimeError:
        _same(ring, deque([2]), "after a refused take")
        return
    raise AssertionError("take(2) with 1 page free should raise RuntimeError")


def test_wraps_and_keeps_length(solution):
    ring = solution.PageRing(3)
    queue = deque(range(3))
    for step in range(50):
        pages = list(ring.take(2))
        assert pages == [queue.popleft(), queue.popleft()], f"step {step}: took {pages}"
        ring.give(pages[::-1])
        queue.extend(pages[::-1])
        assert len(ring.ring) == 3, f"step {step}: the ring has {len(ring.ring)} entries, not 3"
        _same(ring, queue, f"step {step}")


def test_random(solution):
    rng = random.Random(72)
    for case in range(40):
        n = rng.randint(1, 12)
        ring, queue, held = solution.PageRing(n), deque(range(n)), []
        for step in range(60):
            if held and rng.random() < 0.5:
                rng.shuffle(held)
                k = rng.randint(1, len(held))
                back, held = held[:k], held[k:]
                ring.give(list(back))
                queue.extend(back)
            else:
                k = rng.randint(0, len(queue))
                got = list(ring.take(k))
                want = [queue.popleft() for _ in range(k)]
                assert got == want, (
                    f"random case {case}, step {step}: take({k}) gave {got}, expected {want}")
                held += got
            assert len(ring.ring) == n, f"random case {case}: the ring changed length"
            _same(ring, queue, f"random case {case}, step {step}")
