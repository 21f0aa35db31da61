"""Exercise 231: one row of a token bitmask, packed as xgrammar lays it out, then applied."""

from __future__ import annotations


def pack_bitmask(allowed: list[int], vocab_size: int) -> list[int]:
    """ceil(vocab_size / 32) signed int32 words; bit t % 32 of word t // 32 set when token t
    is in `allowed` (any order, repeats allowed)."""
    raise NotImplementedError


def apply_bitmask(logits: list[float], words: list[int]) -> list[float]:
    """A copy of `logits`, -inf where the token's bit is 0; the bits past len(logits) (the
    last word's padding) are not looked at."""
    raise NotImplementedError
