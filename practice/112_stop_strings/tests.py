import random


def _expected(text, stops, finished):
    hits = [text.find(s) for s in stops if s in text]
    if hits:
        return text[: min(hits)], True
    if finished:
        return text, False
    hold = 0
    for s in stops:
        for k in range(len(s) - 1, 0, -1):
            if text[len(text) - k :] == s[:k] and len(text) >= k:
                hold = max(hold, k)
                break
    return text[: len(text) - hold], False


def _stream(solution, stops, pieces, what, finish=False):
    cutter = solution.StopCutter(list(stops))
    text, sent, cut = "", "", None
    for n, piece in enumerate(pieces):
        last = finish and n == len(pieces) - 1
        text += piece
        got = cutter.push(piece, finished=last)
        assert isinstance(got, str), f"{what}: push returned {got!r}, not a str"
        sent += got
        if cut is None:
            want, stopped = _expected(text, stops, last)
            if stopped:
                cut = want
        else:
            want, stopped = cut, True
        assert sent == want, (
            f"{what}: stops={stops}, after pushing {pieces[: n + 1]} "
            f"(finished={last}) the returns join to {sent!r}, expected {want!r}"
        )
        assert bool(cutter.stopped) == stopped, (
            f"{what}: after pushing {pieces[: n + 1]} stopped is {cutter.stopped}, "
            f"expected {stopped}"
        )


def test_readme_example(solution):
    _stream(solution, ["</s>"], ["Hello <", "/", "x", "y</s>z", "more"], "README example")


def test_earliest_stop_wins(solution):
    _stream(solution, ["END", "x"], ["abc", "EN", "Dx"], "two stop strings")
    _stream(solution, ["abcd", "c"], ["ab", "c", "d"], "a shorter stop inside a longer one")


def test_stop_inside_one_piece(solution):
    _stream(solution, ["\n\n"], ["one\n\ntwo"], "a stop string within a piece")


def test_self_overlapping(solution):
    _stream(solution, ["aab"], ["aa", "a", "b", "c"], "'aab' after 'aaa'")


def test_finished_releases_tail(solution):
    _stream(solution, ["STOP"], ["go ST"], "finished with a partial stop", finish=True)
    _stream(solution, ["STOP"], ["go ST", "O"], "then finished", finish=True)


def test_no_stop_strings(solution):
    _stream(solution, [], ["a", "b", "</s>"], "no stop strings")


def test_empty_pieces(solution):
    _stream(solution, ["ab"], ["", "a", "", "b", ""], "empty pieces")


def test_random(solution):
    rng = random.Random(112)
    for case in range(300):
        stops = [
            "".join(rng.choice("abc") for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(0, 3))
        ]
        pieces = [
            "".join(rng.choice("abcd") for _ in range(rng.randint(0, 3)))
            for _ in range(rng.randint(1, 8))
        ]
        _stream(solution, stops, pieces, f"random case {case}", finish=rng.random() < 0.5)
