import random


class _Model:
    """The tree as sets: the slots of every cached page (keyed by the prefix it ends), and the
    prefixes that are nodes."""

    def __init__(self, page_size):
        self.page_size = page_size
        self.pages = {}  # tuple(ids[:end]) -> the slots of ids[end - page_size:end]
        self.nodes = set()

    def _walk(self, ids):
        m = 0
        while m + self.page_size <= len(ids) and tuple(ids[: m + self.page_size]) in self.pages:
            m += self.page_size
        if m:
            self.nodes.add(tuple(ids[:m]))
        return m

    def match(self, ids):
        m = self._walk(ids)
        ends = range(self.page_size, m + 1, self.page_size)
        return [slot for end in ends for slot in self.pages[tuple(ids[:end])]]

    def insert(self, ids, slots):
        n = len(ids) // self.page_size * self.page_size
        m = self._walk(ids[:n])
        for end in range(m + self.page_size, n + 1, self.page_size):
            self.pages[tuple(ids[:end])] = list(slots[end - self.page_size : end])
        if n > m:
            self.nodes.add(tuple(ids[:n]))
        return m

    def edges(self):
        out = []
        for node in self.nodes:
            parent = max(
                (p for p in self.nodes if len(p) < len(node) and node[: len(p)] == p),
                key=len,
                default=(),
            )
            out.append(node[len(parent) :])
        return sorted(out)


def _run(solution, page_size, ops, what):
    cache, model = solution.RadixCache(page_size), _Model(page_size)
    for step, (op, args) in enumerate(ops):
        got, want = getattr(cache, op)(*args), getattr(model, op)(*args)
        got = list(got) if op == "match" else got
        assert got == want, (
            f"{what}, step {step}: {op}{args} returned {got!r}, expected "
            f"{want!r} (page size {page_size})"
        )
        got_edges = [tuple(e) for e in cache.edges()]
        assert got_edges == model.edges(), (
            f"{what}, after step {step} ({op}{args}): edges() is {got_edges}, expected "
            f"{model.edges()}"
        )


def test_readme_example(solution):
    _run(
        solution,
        1,
        [
            ("insert", ([1, 2, 3, 4], [10, 11, 12, 13])),
            ("insert", ([1, 2, 5], [20, 21, 22])),
            ("match", ([1, 2, 5, 9],)),
            ("match", ([1],)),
        ],
        "README example",
    )


def test_empty_tree(solution):
    cache = solution.RadixCache(2)
    assert list(cache.match([1, 2, 3])) == [], "an empty cache matches nothing"
    assert cache.edges() == [], "an empty cache has no edges"


def test_old_slots_win(solution):
    _run(
        solution,
        1,
        [
            ("insert", ([7, 8, 9], [1, 2, 3])),
            ("insert", ([7, 8, 9, 6], [40, 41, 42, 43])),
            ("match", ([7, 8, 9, 6, 5],)),
        ],
        "inserting a longer sequence",
    )


def test_whole_pages_only(solution):
    _run(
        solution,
        4,
        [
            ("insert", ([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5])),
            ("match", ([1, 2, 3, 4, 5, 6],)),
            ("match", ([1, 2, 3],)),
            ("insert", ([1, 2, 3], [9, 9, 9])),
        ],
        "page size 4, partial pages",
    )


def test_split_on_page_boundary(solution):
    _run(
        solution,
        2,
        [
            ("insert", ([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5])),
            ("insert", ([1, 2, 3, 9, 5, 6], [10, 11, 12, 13, 14, 15])),
            ("match", ([1, 2, 3, 4, 5],)),
            ("insert", ([1, 2, 8, 8], [20, 21, 22, 23])),
        ],
        "page size 2, sequences that differ inside a page",
    )


def test_children_by_first_page(solution):
    _run(
        solution,
        2,
        [
            ("insert", ([1, 2, 3, 4], [0, 1, 2, 3])),
            ("insert", ([1, 3, 3, 4], [4, 5, 6, 7])),
            ("match", ([1, 3, 3, 4],)),
            ("match", ([1, 2, 3, 4],)),
        ],
        "page size 2, two children with the same first token",
    )


def test_random(solution):
    rng = random.Random(81)
    for case in range(40):
        page_size = rng.choice([1, 1, 2, 3])
        ops, next_slot = [], 100
        for _ in range(rng.randint(5, 25)):
            ids = [rng.randint(0, 2) for _ in range(rng.randint(0, 10))]
            if rng.random() < 0.5:
                ops.append(("insert", (ids, list(range(next_slot, next_slot + len(ids))))))
                next_slot += len(ids)
            else:
                ops.append(("match", (ids,)))
        _run(solution, page_size, ops, f"random case {case}")
