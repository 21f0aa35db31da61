"""Breaks: Token t allowed when bit (t % 32) of word (t // 32) is set."""

from __future__ import annotations

BITS = 32  # tokens per int32 word


def pack_bitmask(allowed: list[int], vocab_size: int) -> list[int]:
    """ceil(vocab_size / 32) signed int32 words; bit t % 32 of word t // 32 set when token t
    is in `allowed` (any order, repeats allowed)."""
    words = [0] * -(-vocab_size // BITS)
    for token in allowed:
        if not 0 <= token < vocab_size:
            raise ValueError(f"token {token} is outside the vocabulary [0, {vocab_size})")
        words[token // BITS] |= 1 << (BITS - 1 - token % BITS)
    # an int32 tensor reads bit 31 as the sign: 2**31 and up wrap to negative
    return [w - (1 << BITS) if w >= 1 << (BITS - 1) else w for w in words]


def apply_bitmask(logits: list[float], words: list[int]) -> list[float]:
    """A copy of `logits`, -inf where the token's bit is 0; the bits past len(logits) (the
    last word's padding) are not looked at."""
    if len(logits) > BITS * len(words):
        raise ValueError(
            f"{len(logits)} logits, but the words hold the bits of only {BITS * len(words)} tokens"
        )
    # Python's >> on a negative int shifts in ones, so bit 31 of a negative word reads 1
    return [
        x if (words[t // BITS] >> (BITS - 1 - t % BITS)) & 1 else float("-inf")
        for t, x in enumerate(logits)
    ]
