"""Breaks: a partly filled last page counts as held."""

from __future__ import annotations


def _div_ceil(a: int, b: int) -> int:
    return -(-a // b)


def pages_to_finish(prompt_len: int, max_tokens: int, cached_len: int, page_size: int) -> int:
    """Pages the request may still take: up to its last possible cached token, less those it
    holds."""
    last_cached = prompt_len + max_tokens - 1  # the last token is sampled, never run
    return _div_ceil(last_cached, page_size) - cached_len // page_size
