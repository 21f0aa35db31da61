"""Exercise 231's tests: each takes the learner's module and checks its behaviour."""

from __future__ import annotations

import importlib
import itertools
import math
import random

# xgrammar itself, where it is installed (it brings torch): imported here, outside any one
# test's time limit, and through importlib, as an import statement of a package outside the
# standard library is refused in a browser exercise; the browser has neither and skips that test
try:
    xgrammar = importlib.import_module("xgrammar")
    torch = importlib.import_module("torch")
except ImportError:
    xgrammar = torch = None

INF = float("-inf")


def words_by_hand(allowed: set[int], vocab_size: int) -> list[int]:
    """Each word written out as its 32 binary digits, bit 31 first; a leading 1 is the sign of
    an int32, so the word is that value less 2**32."""
    words = []
    for start in range(0, vocab_size, 32):
        digits = "".join(
            "1" if start + bit in allowed and start + bit < vocab_size else "0"
            for bit in reversed(range(32))
        )
        value = int(digits, 2)
        words.append(value - 2**32 if digits[0] == "1" else value)
    return words


def packed(solution, allowed: list[int], vocab_size: int) -> list[int]:
    words = list(solution.pack_bitmask(list(allowed), vocab_size))
    assert all(isinstance(w, int) for w in words), f"words must be ints: {words}"
    return words


def check_pack(solution, allowed: list[int], vocab_size: int, what: str) -> None:
    want = words_by_hand(set(allowed), vocab_size)
    got = packed(solution, allowed, vocab_size)
    assert len(got) == len(want), (
        f"{what}: a vocabulary of {vocab_size} takes {len(want)} words, not {len(got)}"
    )
    call = f"pack_bitmask({sorted(set(allowed)) if len(allowed) <= 8 else '...'}, {vocab_size})"
    if len(want) <= 3:
        assert got == want, f"{what}: {call} is {want}, not {got}"
    for i, (w, g) in enumerate(zip(want, got)):
        assert g == w, f"{what}: word {i} of {call} is {w}, not {g}"


def check_apply(
    solution, logits: list[float], words: list[int], allowed: set[int], what: str
) -> None:
    got = list(solution.apply_bitmask(list(logits), list(words)))
    assert len(got) == len(logits), f"{what}: {len(logits)} logits in, {len(got)} out"
    for t, (x, y) in enumerate(zip(logits, got)):
        if t in allowed:
            assert y == x, f"{what}: token {t} is allowed, so its logit stays {x}, not {y}"
        else:
            assert isinstance(y, float) and math.isinf(y) and y < 0, (
                f"{what}: token {t} is masked, so its logit is -inf, not {y}"
            )


def test_the_statements_example(solution):
    words = packed(solution, [2, 0, 33, 31, 2], 40)
    assert words == [-2147483643, 2], (
        f"pack_bitmask([2, 0, 33, 31, 2], 40) is [-2147483643, 2], not {words}"
    )
    got = list(solution.apply_bitmask([0.5, 1.0, -2.0, 3.0, 0.25], [13]))
    assert got == [0.5, INF, -2.0, 3.0, INF], (
        f"apply_bitmask(..., [13]) is [0.5, -inf, -2.0, 3.0, -inf], not {got}"
    )


def test_one_token_at_every_bit(solution):
    for t in range(64):  # bit 31 of either word makes it negative
        check_pack(solution, [t], 64, f"token {t} alone")


def test_how_many_words(solution):
    for vocab_size in (1, 31, 32, 33, 63, 64, 65, 448, 450):
        check_pack(solution, [0, vocab_size - 1], vocab_size, f"a vocabulary of {vocab_size}")
    words = packed(solution, [449], 450)  # chapter 23's tiny Qwen3
    assert len(words) == 15 and words[14] == 2, (
        f"token 449 of 450 is bit 1 of word 14, the last of 15: not {words}"
    )


def test_every_token_allowed_leaves_the_padding_bits_0(solution):
    for vocab_size, last in ((70, 2**6 - 1), (450, 3), (96, -1), (31, 2**31 - 1)):
        words = packed(solution, list(range(vocab_size)), vocab_size)
        assert words and words[-1] == last, (
            f"every token of {vocab_size} allowed: the last word is {last}, not {words[-1:]}"
        )
        check_pack(solution, list(range(vocab_size)), vocab_size, "every token allowed")


def test_repeats_and_any_order(solution):
    rng = random.Random(231)
    for _ in range(50):
        vocab_size = rng.randint(1, 200)
        allowed = [rng.randrange(vocab_size) for _ in range(rng.randint(0, 2 * vocab_size))]
        check_pack(solution, allowed, vocab_size, "repeated tokens in any order")
    check_pack(solution, [31, 31, 31, 0, 0], 32, "token 31 three times")


def test_a_token_outside_the_vocabulary_is_a_value_error(solution):
    for allowed, vocab_size, bad in (
        ([3, -1], 70, -1),
        ([-40], 70, -40),
        ([5, 71, 2], 70, 71),
        ([95], 70, 95),
        ([96], 70, 96),
        ([450], 450, 450),
    ):
        try:
            words = solution.pack_bitmask(list(allowed), vocab_size)
        except ValueError as e:
            assert str(bad) in str(e), f"the ValueError for token {bad} should name it: {e}"
        else:
            raise AssertionError(
                f"pack_bitmask({allowed}, {vocab_size}) should raise a "
                f"ValueError for token {bad}, not return {words}"
            )


def test_apply_on_random_rows(solution):
    rng = random.Random(2310)
    for _ in range(100):
        vocab_size = rng.randint(1, 200)
        allowed = set(rng.sample(range(vocab_size), rng.randint(0, vocab_size)))
        logits = [rng.uniform(-30, 30) for _ in range(vocab_size)]
        check_apply(solution, logits, words_by_hand(allowed, vocab_size), allowed, "a random row")


def test_apply_ignores_the_padding_bits(solution):
    # every bit set, the padding's too, as xgrammar's allocate_token_bitmask leaves a row
    check_apply(solution, [1.0] * 70, [-1, -1, -1], set(range(70)), "70 logits, 3 words of -1")
    check_apply(solution, [2.0, -1.0, 4.5], [-2], {1, 2}, "3 logits, word -2")
    words = words_by_hand({0, 33, 40}, 70)
    check_apply(solution, [0.25] * 35, words, {0, 33}, "35 logits under a row for 70")
    got = list(solution.apply_bitmask([], [0]))
    assert got == [], f"no logits give no logits, not {got}"


def test_more_logits_than_words_hold_is_a_value_error(solution):
    for logits, words in (([0.0] * 33, [-1]), ([1.0] * 65, [-1, -1]), ([2.0], [])):
        try:
            got = solution.apply_bitmask(list(logits), list(words))
        except ValueError:
            continue
        raise AssertionError(
            f"{len(logits)} logits for the {32 * len(words)} bits of "
            f"{words} should be a ValueError, not {len(list(got))} logits"
        )


def test_inputs_unchanged(solution):
    allowed = [9, 3, 3, 40]
    words = solution.pack_bitmask(allowed, 64)
    assert allowed == [9, 3, 3, 40], f"pack_bitmask changed its allowed list: {allowed}"
    logits, words = [0.5, 1.5, 2.5, -3.0, 7.0], [0b1010]
    got = solution.apply_bitmask(logits, words)
    assert logits == [0.5, 1.5, 2.5, -3.0, 7.0], f"apply_bitmask changed its logits: {logits}"
    assert words == [0b1010], f"apply_bitmask changed its words: {words}"
    assert got is not logits, "apply_bitmask must return a copy, not its logits"


def _vocabulary() -> list[str]:
    """70 tokens (the last word half padding), shuffled so that allowed tokens fall on bit 31;
    the stop token at 63, bit 31 of word 1."""
    strings = [a + b for a, b in itertools.product("abcdwxyz", ["", *"abcdwxyz"])][:69]
    random.Random(23).shuffle(strings)
    return strings[:63] + ["</s>"] + strings[63:]


def _xgrammar_rows(vocab: list[str]) -> tuple[object, list[set[int]]]:
    """Rows that xgrammar's matcher fills, with the tokens it allows, found by trying each
    token on a fresh matcher rather than by reading the bitmask."""
    info = xgrammar.TokenizerInfo(vocab, vocab_size=len(vocab), stop_token_ids=[63])
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    cases = [
        ("[abc]+x", []),
        ("[abc]+x", ["ab"]),
        ("[abc]+x", ["ab", "x"]),
        ("[a-z]+", []),
        ("(da|wx)y*", ["d"]),
    ]
    bitmask = xgrammar.allocate_token_bitmask(len(cases), len(vocab))
    rows = []
    for row, (regex, prefix) in enumerate(cases):
        grammar = compiler.compile_regex(regex)
        matcher = xgrammar.GrammarMatcher(grammar)
        for token in prefix:
            assert matcher.accept_token(vocab.index(token))
        matcher.fill_next_token_bitmask(bitmask, row)
        allowed = set()
        for t in range(len(vocab)):
            trial = xgrammar.GrammarMatcher(grammar)
            if all(trial.accept_token(vocab.index(p)) for p in prefix) and trial.accept_token(t):
                allowed.add(t)
        rows.append(allowed)
    return bitmask, rows


def test_agrees_with_xgrammar_where_installed(solution):
    """Where xgrammar is installed, the rows must be xgrammar's own, and so must the logits its
    kernel masks. The browser has no xgrammar: there only the first line's one-token row is
    checked, so that an unwritten solution fails here as it does locally."""
    assert list(solution.pack_bitmask([0], 1)) == [1], "token 0 alone is bit 0 of word 0"
    if xgrammar is None:
        return
    vocab = _vocabulary()
    bitmask, rows = _xgrammar_rows(vocab)
    assert any(bitmask[:, 1] < 0), "no row of the check sets bit 31 of a word"
    logits = torch.tensor([[(t * 7 % 61 - 30) / 4 for t in range(len(vocab))]] * len(rows))
    want = logits.clone()
    xgrammar.apply_token_bitmask_inplace(want, bitmask)
    for row, allowed in enumerate(rows):
        words = packed(solution, sorted(allowed), len(vocab))
        theirs = bitmask[row].tolist()
        # xgrammar's padding bits are 1 when it fills a row by the tokens it rejects
        theirs[-1] &= 2 ** (len(vocab) % 32) - 1
        assert words == theirs, f"xgrammar's row {row} is {theirs} (padding bits 0), not {words}"
        got = list(solution.apply_bitmask(logits[row].tolist(), bitmask[row].tolist()))
        assert len(got) == len(vocab), f"row {row}: {len(vocab)} logits in, {len(got)} out"
        for t, (x, y) in enumerate(zip(want[row].tolist(), got)):
            assert x == y, f"row {row}: xgrammar masks token {t}'s logit to {x}, not {y}"
