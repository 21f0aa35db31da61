from __future__ import annotations


def pages_to_finish(prompt_len: int, max_tokens: int, cached_len: int, page_size: int) -> int:
    """Pages the request may still take: up to its last possible cached token, less those it
    holds."""
    raise NotImplementedError
