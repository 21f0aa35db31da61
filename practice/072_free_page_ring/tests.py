import random
from collections import deque


class _Watched:
    """A PageRing beside the queue it must hold. `heads` are the ring positions its head can be
    at, given what the ring has shown so far: the free pages must sit at head, head + 1, ...,
    stay where they are when pages are taken or given, and the head moves only on a take."""

    def __init__(self, solution, num_pages: int):
        self.pages = solution.PageRing(num_pages)
        self.num_pages = num_pages
        self.list = self.pages.ring  # the one list the ring lives in
        self.queue = deque(range(num_pages))
        self.heads = set(range(num_pages))
        self.check("a new ring")

    def take(self, n: int, what: str) -> list:
        got = self.pages.take(n)
        assert isinstance(got, list), f"{what}: take({n}) returned a {type(got).__name__}"
        want = [self.queue.popleft() for _ in range(n)]
        assert got == want, f"{what}: take({n}) gave {got}, expected {want}"
        self.heads = {(head + n) % self.num_pages for head in self.heads}
        self.check(f"{what}, after take({n})")
        return got

    def give(self, pages: list, what: str) -> None:
        self.pages.give(list(pages))
        self.queue.extend(pages)
        self.check(f"{what}, after give({pages})")

    def check(self, what: str) -> None:
        ring, queue = self.pages.ring, list(self.queue)
        assert ring is self.list, f"{what}: ring is a new list; write into the one you made"
        assert len(ring) == self.num_pages, (
            f"{what}: ring has {len(ring)} entries, not {self.num_pages}"
        )
        free = self.pages.free_pages()
        assert isinstance(free, list), f"{what}: free_pages() returned a {type(free).__name__}"
        assert free is not ring, f"{what}: free_pages() returned ring itself, not a new list"
        assert free == queue, f"{what}: free_pages() is {free}, expected {queue}"
        assert self.pages.num_free == len(queue), (
            f"{what}: num_free is {self.pages.num_free}, expected {len(queue)}"
        )
        if not queue:
            self.heads = set(range(self.num_pages))  # nothing free: the head may be anywhere
            return
        self.heads = {head for head in self.heads if self._run(head, len(queue)) == queue}
        assert self.heads, (
            f"{what}: ring is {ring}, but the free pages {queue} are not at "
            "ring[head], ring[head + 1], ... where the earlier steps left them"
        )

    def _run(self, head: int, n: int) -> list:
        return [self.pages.ring[(head + j) % self.num_pages] for j in range(n)]


def test_readme_example(solution):
    ring = _Watched(solution, 4)
    ring.take(3, "a new ring of 4")
    ring.give([1], "after take(3)")
    ring.give([0], "after giving 1")
    ring.take(3, "after giving 1 then 0")


def test_initial(solution):
    _Watched(solution, 5)


def test_free_pages_is_a_new_list(solution):
    ring = _Watched(solution, 4)
    for step in range(3):
        ring.pages.free_pages().clear()
        ring.check(f"step {step}, after clearing the list free_pages() returned")
        ring.give(ring.take(2, f"step {step}")[::-1], f"step {step}")


def test_too_many(solution):
    ring = _Watched(solution, 3)
    ring.take(2, "a new ring of 3")
    before = list(ring.pages.ring)
    try:
        ring.pages.take(2)
    except NotImplementedError:
        raise
    except RuntimeError:
        assert ring.pages.ring == before, (
            f"a refused take changed ring from {before} to {ring.pages.ring}"
        )
        ring.check("after a refused take")
        return
    raise AssertionError("take(2) with 1 page free should raise RuntimeError")


def test_wraps_and_keeps_length(solution):
    ring = _Watched(solution, 3)
    for step in range(50):
        ring.give(ring.take(2, f"step {step}")[::-1], f"step {step}")


def test_random(solution):
    rng = random.Random(72)
    for case in range(40):
        n = rng.randint(1, 12)
        ring, held = _Watched(solution, n), []
        for step in range(60):
            what = f"random case {case} (ring of {n}), step {step}"
            if held and rng.random() < 0.5:
                rng.shuffle(held)
                k = rng.randint(1, len(held))
                back, held = held[:k], held[k:]
                ring.give(back, what)
            else:
                held += ring.take(rng.randint(0, len(ring.queue)), what)
