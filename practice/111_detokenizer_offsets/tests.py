import random

VOCAB = [
    b"h",
    b"\xc3",
    b"\xa9",
    b"!",
    b"e",
    b"llo",
    b" ",
    b"\xe4",
    b"\xb8\x96",
    b"\xf0\x9f",
    b"\x98",
    b"\x80",
    b"\xff",
    "wörld".encode(),
    "世界".encode(),
    b"a",
]
WHOLE = [0, 3, 4, 5, 6, 13, 14, 15]  # tokens that are whole characters


class _Counting:
    def __init__(self):
        self.longest = 0

    def __call__(self, ids):
        assert isinstance(ids, list), f"decode takes a list of ids, got {type(ids).__name__}"
        self.longest = max(self.longest, len(ids))
        return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


def _full(ids):
    return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


def _stream(solution, groups, what, finish=True):
    decode = _Counting()
    dec = solution.IncrementalDecoder(decode)
    ids, sent = [], ""
    for n, group in enumerate(groups):
        last = finish and n == len(groups) - 1
        ids += group
        piece = dec.feed(list(group), finished=last)
        assert isinstance(piece, str), f"{what}: feed returned {piece!r}, not a str"
        sent += piece
        want = _full(ids) if last else _full(ids).rstrip("\ufffd")
        assert sent == want, (
            f"{what}: after feeding {groups[: n + 1]} (finished={last}) the "
            f"pieces join to {sent!r}, expected {want!r}"
        )
    return decode


def test_readme_example(solution):
    _stream(solution, [[0, 1], [2], [3]], "README example")


def test_three_and_four_byte_characters(solution):
    _stream(solution, [[7], [8], [6], [9], [10], [11], [3]], "世 and 😀 cut across tokens")


def test_several_ids_at_once(solution):
    _stream(solution, [[0, 4, 5, 6, 13], [1, 2, 7], [8, 9, 10, 11]], "groups of ids")


def test_empty_feeds(solution):
    _stream(solution, [[], [0], [], [1], [], [2], []], "feeds with no ids")


def test_finish_flushes_incomplete(solution):
    _stream(solution, [[0], [7]], "finished inside a character: the U+FFFD is sent")


def test_finish_with_an_empty_feed(solution):
    _stream(solution, [[0], [7], []], "finished by an empty feed while 世's first byte waits")
    _stream(solution, [[0, 9, 10], []], "finished by an empty feed inside a 4-byte character")


def test_invalid_byte(solution):
    _stream(solution, [[0], [12], [4], [12], [1], [2]], "a stray invalid byte")


def test_not_finished_holds_back(solution):
    _stream(solution, [[0], [9], [10]], "unfinished 4-byte character", finish=False)


def test_windows_stay_small(solution):
    rng = random.Random(111)
    groups = [[rng.choice(WHOLE)] for _ in range(300)]
    decode = _stream(solution, groups, "300 whole-character tokens")
    assert decode.longest <= 8, (
        f"a decode call got {decode.longest} ids: decode a window from "
        "surr_offset, not everything so far"
    )


def test_random(solution):
    rng = random.Random(11)
    for case in range(60):
        ids = [rng.randrange(len(VOCAB)) for _ in range(rng.randint(0, 30))]
        groups, i = [], 0
        while i < len(ids) or not groups:
            n = rng.choice([0, 1, 1, 1, 2, 3])
            groups.append(ids[i : i + n])
            i += n
        _stream(solution, groups, f"random case {case}")
